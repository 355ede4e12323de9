// The checkpoint's trainer_state.json carries the m3_adapt λ controller and
// the alarm monitor: a save/restore round trip resumes with the same λ and
// the same alarm averages (and goes on exactly as the uninterrupted run), and
// a checkpoint written before they were recorded still loads, saying so.
#include "learner/run_state.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kappa::learner {
namespace {

namespace fs = std::filesystem;

// Every log line's text.
class LogLines final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  bool Has(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::any_of(lines_.begin(), lines_.end(), [&](const std::string& line) {
      return line.find(text) != std::string::npos;
    });
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

AlarmConfig Alarms() {
  AlarmConfig config;
  config.ema_alpha = 0.3;
  config.slope_window = 4;
  config.warmup_steps = 2;
  config.conflict_window = 3;
  config.collapse_window = 3;
  return config;
}

// A run whose κ climbs, L_D rises and K_DR conflicts: every average moves,
// and alarms fire.
StepObservation Observation(int step) {
  StepObservation o;
  o.step = step;
  o.kappa = 3.0 + 1.7 * step;
  o.distill_loss = 0.5 + 0.05 * step;
  o.kdr_negative_weighted_fraction = step % 4 == 0 ? 0.2 : 0.7;
  o.reward_mean = 0.6 / (1 + 0.1 * step);
  o.entropy = 1.0 / step;
  if (step % 3 != 0) o.inference_mismatch = 0.01 * step;
  return o;
}

LambdaControllerConfig Adapt() {
  LambdaControllerConfig config;
  config.gain = 0.5;
  config.ema = 0.2;
  return config;
}

void ExpectSameAlarmState(const AlarmMonitorState& a, const AlarmMonitorState& b) {
  EXPECT_EQ(a.observations, b.observations);
  EXPECT_EQ(a.kappa_ema, b.kappa_ema);
  EXPECT_EQ(a.distill_ema, b.distill_ema);
  EXPECT_EQ(a.reward_ema, b.reward_ema);
  EXPECT_EQ(a.entropy_ema, b.entropy_ema);
  EXPECT_EQ(a.distill_history, b.distill_history);
  EXPECT_EQ(a.best_reward_ema, b.best_reward_ema);
  EXPECT_EQ(a.min_distill_ema, b.min_distill_ema);
  EXPECT_EQ(a.conflict_run, b.conflict_run);
  EXPECT_EQ(a.reward_run, b.reward_run);
  EXPECT_EQ(a.distill_run, b.distill_run);
  EXPECT_EQ(a.entropy_run, b.entropy_run);
  EXPECT_EQ(a.mismatch_run, b.mismatch_run);
  for (int k = 0; k < kNumAlarmKinds; ++k) {
    EXPECT_EQ(a.active[k], b.active[k]) << AlarmName(kAllAlarmKinds[k]);
    EXPECT_EQ(a.clear_run[k], b.clear_run[k]) << AlarmName(kAllAlarmKinds[k]);
    EXPECT_EQ(a.fired[k], b.fired[k]) << AlarmName(kAllAlarmKinds[k]);
  }
}

class RunStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("kappa_run_state_" + std::to_string(getpid()))).string();
    fs::create_directories(dir_);
    log_ = std::make_shared<LogLines>();
    spdlog::default_logger()->sinks().push_back(log_);
  }
  void TearDown() override {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log_), sinks.end());
    fs::remove_all(dir_);
  }

  std::string dir_;
  std::shared_ptr<LogLines> log_;
};

TEST_F(RunStateTest, RoundTripResumesTheSameLambdaAndAlarmAverages) {
  LambdaController lambda(1.0, 1.0, Adapt());
  AlarmMonitor alarms(Alarms());
  for (int step = 1; step <= 9; ++step) {
    lambda.Update(2.0 + 0.3 * step, 0.7);
    alarms.Observe(Observation(step));
  }
  ASSERT_NE(lambda.lambda(), 1.0);
  ASSERT_GT(alarms.fired(AlarmKind::kDirectionalConflict), 0);

  TrainerState saved;
  saved.step = 9;
  saved.policy_version = 9;
  saved.lambda_controller = lambda.state();
  saved.alarms = alarms.state();
  ASSERT_TRUE(WriteTrainerState(dir_, saved).ok());
  absl::StatusOr<TrainerState> read = ReadTrainerState(dir_);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->lambda_controller.has_value()) << "trainer_state.json lacks the λ controller";
  ASSERT_TRUE(read->alarms.has_value()) << "trainer_state.json lacks the alarm monitor";

  // A resumed learner builds both afresh from the configuration, then restores.
  LambdaController resumed_lambda(1.0, 1.0, Adapt());
  AlarmMonitor resumed_alarms(Alarms());
  ASSERT_TRUE(RestoreMonitors(*read, &resumed_lambda, &resumed_alarms).ok());
  EXPECT_EQ(resumed_lambda.lambda(), lambda.lambda());  // bit for bit
  EXPECT_EQ(resumed_lambda.kappa_ema(), lambda.kappa_ema());
  ExpectSameAlarmState(resumed_alarms.state(), alarms.state());

  // And both go on exactly as one uninterrupted run would.
  for (int step = 10; step <= 16; ++step) {
    lambda.Update(1.0 + 0.1 * step, 0.9);
    resumed_lambda.Update(1.0 + 0.1 * step, 0.9);
    EXPECT_EQ(resumed_lambda.lambda(), lambda.lambda()) << "step " << step;
    const std::vector<AlarmEvent> events = alarms.Observe(Observation(step));
    const std::vector<AlarmEvent> resumed_events = resumed_alarms.Observe(Observation(step));
    ASSERT_EQ(events.size(), resumed_events.size()) << "step " << step;
    for (size_t i = 0; i < events.size(); ++i) {
      EXPECT_EQ(events[i].kind, resumed_events[i].kind);
      EXPECT_EQ(events[i].message, resumed_events[i].message);
    }
  }
  ExpectSameAlarmState(resumed_alarms.state(), alarms.state());
}

// A NaN or infinite average (a diverged series) is saved and read back as it
// was: it must not make the checkpoint unreadable.
TEST_F(RunStateTest, NonFiniteAveragesSurviveTheRoundTrip) {
  TrainerState saved;
  saved.step = 3;
  AlarmMonitorState alarms;
  alarms.observations = 3;
  alarms.kappa_ema = std::numeric_limits<double>::infinity();
  alarms.entropy_ema = std::numeric_limits<double>::quiet_NaN();
  alarms.distill_history = {1.0, -std::numeric_limits<double>::infinity()};
  saved.alarms = alarms;
  saved.lambda_controller = LambdaControllerState{0.25, std::nullopt};
  ASSERT_TRUE(WriteTrainerState(dir_, saved).ok());
  absl::StatusOr<TrainerState> read = ReadTrainerState(dir_);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->alarms && read->lambda_controller);
  EXPECT_EQ(read->alarms->kappa_ema, std::numeric_limits<double>::infinity());
  ASSERT_TRUE(read->alarms->entropy_ema.has_value());
  EXPECT_TRUE(std::isnan(*read->alarms->entropy_ema));
  EXPECT_FALSE(read->alarms->reward_ema.has_value());
  EXPECT_EQ(read->alarms->distill_history, alarms.distill_history);
  EXPECT_EQ(read->lambda_controller->lambda, 0.25);
  EXPECT_FALSE(read->lambda_controller->kappa_ema.has_value());
}

TEST_F(RunStateTest, AnOldCheckpointWithoutThemStillLoadsAndSaysSo) {
  std::ofstream(dir_ + "/trainer_state.json")
      << R"({"step": 12, "policy_version": 12, "data_position": 96, "seed": 5,
             "pending_prompts": [3, 4]})";
  absl::StatusOr<TrainerState> read = ReadTrainerState(dir_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 12);
  EXPECT_FALSE(read->lambda_controller.has_value());
  EXPECT_FALSE(read->alarms.has_value());

  LambdaController lambda(0.5, 1.0, Adapt());
  AlarmMonitor alarms(Alarms());
  ASSERT_TRUE(RestoreMonitors(*read, &lambda, &alarms).ok());
  EXPECT_EQ(lambda.lambda(), 0.5);  // afresh, from trainer.lambda
  EXPECT_EQ(alarms.state().observations, 0);
  EXPECT_TRUE(log_->Has("the checkpoint of step 12 has no m3_adapt state"));
  EXPECT_TRUE(log_->Has("the checkpoint of step 12 has no alarm monitor state"));
}

TEST_F(RunStateTest, AFreshRunRestoresNothingAndABadStateIsRefused) {
  TrainerState fresh;  // step 0
  LambdaController lambda(0.5, 1.0, Adapt());
  ASSERT_TRUE(RestoreMonitors(fresh, &lambda, nullptr).ok());
  EXPECT_FALSE(log_->Has("has no m3_adapt state"));

  TrainerState bad;
  bad.step = 4;
  bad.lambda_controller = LambdaControllerState{-1.0, std::nullopt};
  const absl::Status status = RestoreMonitors(bad, &lambda, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("lambda"), std::string::npos) << status;
  EXPECT_EQ(lambda.lambda(), 0.5);
}

}  // namespace
}  // namespace kappa::learner
