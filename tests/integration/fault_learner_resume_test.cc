// Fault: the learner is SIGKILLed mid-run, twice (once at a random step,
// once while it is writing a checkpoint), and restarted with --resume each
// time. The run must end with parameters bit-identical to an uninterrupted
// run with the same seeds: the checkpoint restores the step, the AdamW
// moments and step counter, the prompt stream position and the prompts that
// were in flight, and `latest` never names a half-written checkpoint.
//
// Determinism needs the inputs fixed: one in-process worker (max_outstanding
// 1) answers every prompt with a group that depends on the prompt alone and
// claims policy version 0, with max_staleness large enough that no group is
// dropped; the learner then consumes prompts in lease order. The worker
// reconnects by itself after each kill. (Real workers sample with whatever
// policy version they hold when a lease arrives, so a real run is not
// reproducible step for step; docs/reliability.md.)
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <regex>
#include <string>
#include <thread>

#include "cli/process_supervisor.h"
#include "tests/integration/fault_fake_worker.h"
#include "tests/integration/fault_services.h"
#include "tests/integration/run_files.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kappa::testing::ReadAll;

constexpr int kSteps = 16;
constexpr auto kRunLimit = std::chrono::seconds(90);

int LastStep(const fs::path& metrics) {
  int step = 0;
  for (const nlohmann::json& record : kappa::testing::StepRecords(metrics)) {
    step = std::max(step, record.value("step", 0));
  }
  return step;
}

// The "final parameters ... fingerprint X" line the learner logs at the end.
std::string Fingerprint(const fs::path& log) {
  std::smatch match;
  const std::string text = ReadAll(log);
  return std::regex_search(text, match, std::regex("fingerprint ([0-9a-f]{16})")) ? match[1].str()
                                                                                  : "";
}

// True while a checkpoint is half written: a step directory still under its
// temporary name, one without trainer_state.json yet, or `latest` being
// replaced.
bool CheckpointBeingWritten(const fs::path& checkpoints) {
  std::error_code error;
  for (fs::directory_iterator it(checkpoints, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.find(".tmp-") != std::string::npos) return true;
    if (name.rfind("step-", 0) == 0 && !fs::exists(it->path() / "trainer_state.json")) return true;
  }
  return false;
}

class LearnerResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kappa-fault-resume-" + std::to_string(getpid()));
    fs::remove_all(root_);
    config_ = kappa::testing::WriteStandaloneRun(
        root_, "{steps: " + std::to_string(kSteps) +
                   ", groups_per_step: 3, group_size: 4, eval_every: 0, eval_examples: 4,"
                   " checkpoint_every: 1}");
  }
  void TearDown() override {
    supervisor_.StopAll(std::chrono::seconds(5));
    if (!HasFailure()) fs::remove_all(root_);
  }

  // Starts a learner for `run_dir` on `address`, SERVING.
  pid_t StartLearner(const fs::path& run_dir, const std::string& address, bool resume,
                     const std::string& log_name) {
    std::vector<std::string> args = {"learner.max_staleness=1000", "learner.threads=1",
                                     "--address", address, "--run-dir", run_dir.string()};
    if (resume) args.push_back("--resume");
    const fs::path log = root_ / log_name;
    absl::StatusOr<pid_t> pid = supervisor_.Spawn(
        kappa::testing::ServiceSpec("learner", KAPPA_LEARNER, config_, args, log));
    EXPECT_TRUE(pid.ok()) << pid.status();
    EXPECT_TRUE(kappa::testing::AwaitServing(address, std::chrono::seconds(60))) << ReadAll(log);
    return pid.ok() ? *pid : 0;
  }

  void ExpectFinished(pid_t learner, const std::string& log_name) {
    const std::optional<kappa::cli::ExitStatus> exit = supervisor_.WaitFor(learner, kRunLimit);
    ASSERT_TRUE(exit.has_value()) << "learner did not finish\n" << ReadAll(root_ / log_name);
    EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << ReadAll(root_ / log_name);
  }

  kappa::testing::FakeWorkerOptions WorkerOptions() const {
    kappa::testing::FakeWorkerOptions options;
    options.worker_id = "deterministic";
    options.max_outstanding = 1;
    options.report_version = 0;
    options.sample_time = std::chrono::milliseconds(10);
    return options;
  }

  fs::path root_;
  fs::path config_;
  kappa::cli::ProcessSupervisor supervisor_;
};

TEST_F(LearnerResumeTest, KilledAndResumedLearnerEndsBitIdenticalToAnUninterruptedRun) {
  const auto test_start = Clock::now();
  // The uninterrupted reference.
  {
    const std::string address = kappa::testing::FreeLoopbackAddress();
    const pid_t learner = StartLearner(root_ / "reference", address, false, "reference.log");
    kappa::testing::FakeWorker worker(kappa::testing::FastReconnectChannel(address),
                                      WorkerOptions());
    worker.Start();
    ExpectFinished(learner, "reference.log");
  }
  const std::string reference = Fingerprint(root_ / "reference.log");
  ASSERT_FALSE(reference.empty()) << ReadAll(root_ / "reference.log");

  // The interrupted run: same seeds, same address for all its learners, so
  // the worker finds each restarted one by itself.
  const fs::path run_dir = root_ / "interrupted";
  const std::string address = kappa::testing::FreeLoopbackAddress();
  kappa::testing::FakeWorker worker(kappa::testing::FastReconnectChannel(address),
                                    WorkerOptions());
  pid_t learner = StartLearner(run_dir, address, false, "run-1.log");
  worker.Start();

  // Kill 1: at a random step.
  std::mt19937 rng(std::random_device{}());
  const int kill_step = std::uniform_int_distribution<int>(2, 6)(rng);
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (LastStep(run_dir / "metrics.jsonl") < kill_step && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(LastStep(run_dir / "metrics.jsonl"), kill_step) << ReadAll(root_ / "run-1.log");
  supervisor_.Signal(learner, SIGKILL);
  ASSERT_TRUE(supervisor_.WaitFor(learner, std::chrono::seconds(10)).has_value());
  const int killed_at_1 = LastStep(run_dir / "metrics.jsonl");
  ASSERT_LT(killed_at_1, kSteps) << "the run ended before the kill";

  // Kill 2: while a checkpoint is being written (polled; if the 1 ms polls
  // never catch one within a few steps, at whatever point that is).
  learner = StartLearner(run_dir, address, true, "run-2.log");
  const int resumed_at = LastStep(run_dir / "metrics.jsonl");
  bool caught_mid_write = false;
  deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && LastStep(run_dir / "metrics.jsonl") < resumed_at + 4) {
    if (LastStep(run_dir / "metrics.jsonl") > killed_at_1 &&
        CheckpointBeingWritten(run_dir / "checkpoints")) {
      caught_mid_write = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  supervisor_.Signal(learner, SIGKILL);
  ASSERT_TRUE(supervisor_.WaitFor(learner, std::chrono::seconds(10)).has_value());
  const int killed_at_2 = LastStep(run_dir / "metrics.jsonl");
  ASSERT_LT(killed_at_2, kSteps) << "the run ended before the second kill";

  // `latest` names a complete checkpoint, and the run finishes from it.
  const std::string latest = ReadAll(run_dir / "checkpoints" / "latest");
  const fs::path latest_dir = run_dir / "checkpoints" / latest.substr(0, latest.find('\n'));
  for (const char* file : {"model.safetensors", "config.json", "optimizer.pt",
                           "trainer_state.json"}) {
    EXPECT_TRUE(fs::exists(latest_dir / file)) << latest_dir / file;
  }
  learner = StartLearner(run_dir, address, true, "run-3.log");
  ExpectFinished(learner, "run-3.log");
  worker.Stop();

  EXPECT_NE(ReadAll(root_ / "run-2.log").find("resuming from"), std::string::npos);
  EXPECT_NE(ReadAll(root_ / "run-3.log").find("resuming from"), std::string::npos);
  EXPECT_GE(worker.stats().connections, 3) << "the worker reconnected to each new learner";
  EXPECT_EQ(Fingerprint(root_ / "run-3.log"), reference)
      << "killed after step " << killed_at_1 << " and after step " << killed_at_2
      << (caught_mid_write ? " (mid-checkpoint)" : "") << "\n"
      << ReadAll(root_ / "run-3.log");
  std::cout << "killed after step " << killed_at_1 << ", then after step " << killed_at_2
            << (caught_mid_write ? " while a checkpoint was being written" : "")
            << "; resumed run's parameters " << Fingerprint(root_ / "run-3.log")
            << ", uninterrupted " << reference << "; "
            << std::chrono::duration<double>(Clock::now() - test_start).count() << " s\n";
}

}  // namespace
