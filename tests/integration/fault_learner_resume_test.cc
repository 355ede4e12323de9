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
//
// Also: NaN gradients injected into the real learner (--debug-nan-grad) are
// skipped, counted and, after trainer.max_nonfinite_steps in a row, stop it
// with `latest` on the last good checkpoint.
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
#include <vector>

#include "cli/process_supervisor.h"
#include "tests/integration/fault_fake_worker.h"
#include "tests/integration/fault_services.h"
#include "tests/integration/run_files.h"
#include "tests/services/http_get.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kappa::testing::kAnyLoopbackPort;
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

  // Starts a learner for `run_dir` and returns once it is SERVING, with the
  // addresses it bound. An empty `*address` becomes the port the learner
  // binds itself; a restart passes the same `*address` again, so a worker
  // finds the new learner where the old one was. `extra`: more flags and
  // overrides (`--metrics-address`, kAnyLoopbackPort for /metrics).
  kappa::testing::ReadyService StartLearner(const fs::path& run_dir, std::string* address,
                                            bool resume, const std::string& log_name,
                                            const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"learner.max_staleness=1000",
                                     "learner.threads=1",
                                     "--address",
                                     address->empty() ? kAnyLoopbackPort : *address,
                                     "--run-dir",
                                     run_dir.string()};
    if (resume) args.push_back("--resume");
    args.insert(args.end(), extra.begin(), extra.end());
    const fs::path log = root_ / log_name;
    absl::StatusOr<kappa::testing::ReadyService> started = kappa::testing::SpawnReady(
        supervisor_, kappa::testing::ServiceSpec("learner", KAPPA_LEARNER, config_, args, log),
        root_ / (log_name + ".ready.json"));
    EXPECT_TRUE(started.ok()) << started.status() << "\n" << ReadAll(log);
    if (!started.ok()) return {};
    *address = started->ready.address;
    return *started;
  }

  void ExpectFinished(pid_t learner, const std::string& log_name) {
    const std::optional<kappa::cli::ExitStatus> exit = supervisor_.WaitFor(learner, kRunLimit);
    ASSERT_TRUE(exit.has_value()) << "learner did not finish\n" << ReadAll(root_ / log_name);
    EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << ReadAll(root_ / log_name);
  }

  // What a fault run left: its /metrics page just before the SIGTERM, how
  // the learner exited, its log.
  struct FaultRun {
    fs::path run_dir;
    std::string page;
    kappa::testing::TimedExit exit;
    std::string log;
  };
  // A learner `name` (run dir root_/name, log name.log, /metrics on), with
  // `extra` flags, fed by one fake worker (`options`) until metrics.jsonl
  // reaches `steps` (60 s at most), then stopped with SIGTERM.
  FaultRun RunUntilStep(const std::string& name, int steps, std::vector<std::string> extra,
                        const kappa::testing::FakeWorkerOptions& options) {
    FaultRun run;
    run.run_dir = root_ / name;
    extra.insert(extra.end(), {"trainer.steps=100000", "--metrics-address", kAnyLoopbackPort});
    std::string address;
    const kappa::testing::ReadyService started =
        StartLearner(run.run_dir, &address, false, name + ".log", extra);
    kappa::testing::FakeWorker worker(kappa::testing::FastReconnectChannel(address), options);
    worker.Start();
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (LastStep(run.run_dir / "metrics.jsonl") < steps && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    run.page = kappa::testing::HttpGet(started.ready.metrics_address, "/metrics").body;
    run.exit = kappa::testing::ExitAfterSigterm(supervisor_, started.pid, std::chrono::seconds(20));
    worker.Stop();
    run.log = ReadAll(root_ / (name + ".log"));
    return run;
  }

  // What a run that stops by itself left: its exit (nullopt: still running
  // after kRunLimit) and its log.
  struct StoppedRun {
    fs::path run_dir;
    std::optional<kappa::cli::ExitStatus> exit;
    std::string log;
  };
  // A learner `name` with `extra` flags, fed by one fake worker until it
  // exits on its own (kRunLimit at most).
  StoppedRun RunUntilExit(const std::string& name, const std::vector<std::string>& extra) {
    StoppedRun run;
    run.run_dir = root_ / name;
    std::string address;
    const pid_t learner = StartLearner(run.run_dir, &address, false, name + ".log", extra).pid;
    kappa::testing::FakeWorker worker(kappa::testing::FastReconnectChannel(address),
                                      WorkerOptions());
    worker.Start();
    run.exit = supervisor_.WaitFor(learner, kRunLimit);
    worker.Stop();
    run.log = ReadAll(root_ / (name + ".log"));
    return run;
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
    std::string address;
    const pid_t learner = StartLearner(root_ / "reference", &address, false, "reference.log").pid;
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
  std::string address;
  pid_t learner = StartLearner(run_dir, &address, false, "run-1.log").pid;
  kappa::testing::FakeWorker worker(kappa::testing::FastReconnectChannel(address), WorkerOptions());
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
  learner = StartLearner(run_dir, &address, true, "run-2.log").pid;
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
  learner = StartLearner(run_dir, &address, true, "run-3.log").pid;
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

// How many times `needle` occurs in `text`.
int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The non-finite guard on the real binary (docs/algorithms.md, "Non-finite
// steps"), with NaN gradients injected by --debug-nan-grad. One bad batch at
// step 3: skipped (`ALARM nonfinite`, kappa_learner_steps_skipped_total),
// and step 3 is trained on the next batch. Every batch at step 3 bad:
// trainer.max_nonfinite_steps (3) skips in a row stop the learner with exit
// 1, naming the step and the term, and `latest` is step-2, finite.
// Issue 45: the learner trains only on what it handed out. A worker returns
// a group whose prompt leaves the 12-position student no room (before, it
// passed decoding and ended the learner inside the step, and --resume
// repeated it), then one whose prompt is another example's. Both are refused
// naming the field and counted by reason; the run goes on.
TEST_F(LearnerResumeTest, AGroupTheLearnerDidNotHandOutIsRefusedAndTheRunGoesOn) {
  kappa::testing::FakeWorkerOptions options = WorkerOptions();
  options.tamper = [](int64_t n, kappa::v1::ScoredGroup& group) {
    if (n == 0) {
      while (group.prompt_tokens_size() < 13) group.add_prompt_tokens(5);
    } else if (n == 1) {
      group.set_prompt_tokens(0, group.prompt_tokens(0) == 5 ? 6 : 5);
    }
  };
  const FaultRun run = RunUntilStep("tampered", 3, {}, options);
  const fs::path& run_dir = run.run_dir;
  const std::string& page = run.page;
  const kappa::testing::TimedExit& exit = run.exit;
  const std::string& log = run.log;
  EXPECT_GE(LastStep(run_dir / "metrics.jsonl"), 3) << log;
  EXPECT_NE(log.find("INVALID_ARGUMENT: prompt_tokens: length 13 leaves no position for a "
                     "response (the student's max_position_embeddings is 12)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("INVALID_ARGUMENT: prompt_tokens: not the prompt of the example lease "),
            std::string::npos)
      << log;
  for (const char* reason : {"positions", "prompt"}) {
    EXPECT_NE(
        page.find(std::string("kappa_learner_groups_refused_total{reason=\"") + reason + "\"} 1"),
        std::string::npos)
        << reason << "\n"
        << page;
  }
  EXPECT_TRUE(exit.status.success()) << exit.status.ToString() << "\n" << log;
}

// Issue 45: a group that passed the wire checks but that the step cannot
// build a batch from (here a NaN reward put in after the checks, by
// --debug-bad-group) is dropped, counted and its prompt leased again; the
// step trains on a full batch and the run goes on (it used to end the
// learner from inside the step).
TEST_F(LearnerResumeTest, AGroupTheStepCannotBatchIsDroppedAndTheRunGoesOn) {
  const FaultRun run = RunUntilStep("unbatchable", 4, {"--debug-bad-group", "2"}, WorkerOptions());
  const fs::path& run_dir = run.run_dir;
  const std::string& page = run.page;
  const kappa::testing::TimedExit& exit = run.exit;
  const std::string& log = run.log;
  ASSERT_GE(LastStep(run_dir / "metrics.jsonl"), 4) << log;
  EXPECT_EQ(Count(log,
                  "dropped: BuildTrainBatch: group 0 sample 0: non-finite reward; its "
                  "prompt is leased again"),
            1)
      << log;
  EXPECT_NE(page.find("kappa_learner_groups_refused_total{reason=\"batch\"} 1"), std::string::npos)
      << page;
  // Every step, step 2 included, trained on groups_per_step (3) groups.
  int steps = 0;
  for (const nlohmann::json& record : kappa::testing::StepRecords(run_dir / "metrics.jsonl")) {
    if (!record.contains("lease_ids")) continue;
    ++steps;
    EXPECT_EQ(record["step"], steps);
    EXPECT_EQ(record["lease_ids"].size(), 3u) << record.dump();
  }
  EXPECT_TRUE(exit.status.success()) << exit.status.ToString() << "\n" << log;
}

// Issue 45: four streams that take all 8 buffer slots and never answer do
// not stall training. Once their leases expire they are leased nothing for
// a lease timeout (then one at a time), and a real worker that joins after
// them gets the slots and trains.
TEST_F(LearnerResumeTest, IdleStreamsHoldingEverySlotDoNotStallTraining) {
  const fs::path run_dir = root_ / "idle";
  std::string address;
  const kappa::testing::ReadyService started =
      StartLearner(run_dir, &address, false, "idle.log",
                   {"trainer.steps=100000", "learner.lease_timeout_ms=1000", "--metrics-address",
                    kAnyLoopbackPort});
  std::vector<std::unique_ptr<kappa::testing::FakeWorker>> idle;
  for (int i = 0; i < 4; ++i) {
    kappa::testing::FakeWorkerOptions options = WorkerOptions();
    options.worker_id = "idle-" + std::to_string(i);
    options.max_outstanding = 2;
    options.silent = true;
    idle.push_back(std::make_unique<kappa::testing::FakeWorker>(
        kappa::testing::FastReconnectChannel(address), options));
    idle.back()->Start();
  }
  auto idle_items = [&] {
    int64_t items = 0;
    for (const auto& worker : idle) items += worker->stats().items;
    return items;
  };
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (idle_items() < 8 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(idle_items(), 8) << "the idle streams did not take every slot";
  kappa::testing::FakeWorker worker(kappa::testing::FastReconnectChannel(address), WorkerOptions());
  worker.Start();
  deadline = Clock::now() + std::chrono::seconds(30);
  while (LastStep(run_dir / "metrics.jsonl") < 3 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string page = kappa::testing::HttpGet(started.ready.metrics_address, "/metrics").body;
  const kappa::testing::TimedExit exit =
      kappa::testing::ExitAfterSigterm(supervisor_, started.pid, std::chrono::seconds(20));
  worker.Stop();
  for (auto& stream : idle) stream->Stop();
  const std::string log = ReadAll(root_ / "idle.log");
  EXPECT_GE(LastStep(run_dir / "metrics.jsonl"), 3) << log;
  EXPECT_GE(worker.stats().groups_sent, 9) << "the real worker trained three steps of 3 groups";
  EXPECT_NE(page.find("kappa_learner_streams_silenced_total 4"), std::string::npos) << page;
  EXPECT_TRUE(exit.status.success()) << exit.status.ToString() << "\n" << log;
}

// Issue 45: a step that throws (--debug-step-throw; a failure nothing
// checked before it caught) drops its batch and the run goes on: step 3 is
// trained on the next batch. Every try at step 3 throwing ends the learner
// after trainer.max_nonfinite_steps (3) in a row, naming the step.
TEST_F(LearnerResumeTest, AStepThatThrowsDropsItsBatchThenStopsTheLearner) {
  const std::string failed_line =
      "ALARM step_failed at step 3: training step 3: injected by "
      "--debug-step-throw; the batch of 3 groups was dropped";
  {
    const FaultRun run =
        RunUntilStep("one-throw", 5, {"--debug-step-throw", "3:1"}, WorkerOptions());
    const fs::path& run_dir = run.run_dir;
    const std::string& page = run.page;
    const kappa::testing::TimedExit& exit = run.exit;
    const std::string& log = run.log;
    ASSERT_GE(LastStep(run_dir / "metrics.jsonl"), 5) << log;
    EXPECT_EQ(Count(log, failed_line), 1) << log;
    EXPECT_NE(page.find("kappa_learner_steps_skipped_total{reason=\"exception\"} 1"),
              std::string::npos)
        << page;
    EXPECT_TRUE(exit.status.success()) << exit.status.ToString() << "\n" << log;
  }
  {
    const StoppedRun run = RunUntilExit("always-throws", {"--debug-step-throw", "3"});
    const fs::path& run_dir = run.run_dir;
    const std::optional<kappa::cli::ExitStatus>& exit = run.exit;
    const std::string& log = run.log;
    ASSERT_TRUE(exit.has_value()) << "the learner did not stop\n" << log;
    EXPECT_EQ(exit->exit_code, 1) << exit->ToString() << "\n" << log;
    EXPECT_EQ(Count(log, failed_line), 2) << log;
    EXPECT_NE(log.find("injected by --debug-step-throw (3 batches in a row, "
                       "trainer.max_nonfinite_steps); checkpoints/latest still names step-2"),
              std::string::npos)
        << log;
    EXPECT_EQ(LastStep(run_dir / "metrics.jsonl"), 2);
  }
}

TEST_F(LearnerResumeTest, NonFiniteStepsAreSkippedThenStopTheLearner) {
  const std::string skipped_line = "ALARM nonfinite at step 3: grad_norm is not finite";
  {
    const FaultRun run =
        RunUntilStep("one-bad-batch", 5, {"--debug-nan-grad", "3:1"}, WorkerOptions());
    const fs::path& run_dir = run.run_dir;
    const std::string& page = run.page;
    const kappa::testing::TimedExit& exit = run.exit;
    const std::string& log = run.log;
    ASSERT_GE(LastStep(run_dir / "metrics.jsonl"), 5) << log;
    EXPECT_EQ(Count(log, skipped_line), 1) << log;
    EXPECT_NE(page.find("kappa_learner_steps_skipped_total{reason=\"nonfinite\"} 1"),
              std::string::npos)
        << page;
    std::vector<int> steps;
    for (const nlohmann::json& record : kappa::testing::StepRecords(run_dir / "metrics.jsonl")) {
      if (record.contains("lease_ids")) steps.push_back(record.value("step", 0));
    }
    ASSERT_GE(steps.size(), 5u);
    for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], static_cast<int>(i) + 1);
    EXPECT_TRUE(exit.status.success()) << exit.status.ToString() << "\n" << log;
  }
  {
    const StoppedRun run = RunUntilExit("bad-from-step-3", {"--debug-nan-grad", "3"});
    const fs::path& run_dir = run.run_dir;
    const std::optional<kappa::cli::ExitStatus>& exit = run.exit;
    const std::string& log = run.log;
    ASSERT_TRUE(exit.has_value()) << "the learner did not stop\n" << log;
    EXPECT_EQ(exit->exit_code, 1) << exit->ToString() << "\n" << log;
    EXPECT_EQ(Count(log, skipped_line), 3) << log;
    EXPECT_NE(log.find("step 3: grad_norm was not finite on 3 batches in a row"), std::string::npos)
        << log;
    EXPECT_NE(log.find("checkpoints/latest still names step-2"), std::string::npos) << log;
    EXPECT_EQ(LastStep(run_dir / "metrics.jsonl"), 2);
    const std::string latest = ReadAll(run_dir / "checkpoints" / "latest");
    EXPECT_EQ(latest.substr(0, latest.find('\n')), "step-2");
    EXPECT_FALSE(fs::exists(run_dir / "checkpoints" / "step-3"));
    kappa::model::Decoder student =
        kappa::model::LoadCheckpoint((run_dir / "checkpoints" / "step-2").string());
    for (const torch::Tensor& p : student->parameters()) {
      EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
    }
    std::smatch alarm, failed;
    std::regex_search(log, alarm, std::regex("ALARM nonfinite[^\n]*"));
    std::regex_search(log, failed, std::regex("training failed[^\n]*"));
    std::cout << alarm.str() << "\n" << failed.str() << "\n";
  }
}

}  // namespace
