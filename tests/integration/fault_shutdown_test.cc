// Fault: stalls and unread streams must never make a process hang on the way
// out. With teacher, verifier, learner and two workers running on loopback,
// one worker is frozen (SIGSTOP: it holds connections and a Rollout stream
// to every service and reads nothing) and a test client holds a Rollout and
// a WatchPolicy stream open without reading. Then each binary gets SIGTERM:
// the live worker while its verifier is frozen (its Verify call can only end
// by deadline or cancellation), then the learner, the teacher and the
// verifier. Each must exit cleanly within kBound.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "cli/process_supervisor.h"
#include "kappa/v1/learner.grpc.pb.h"
#include "tests/integration/fault_services.h"
#include "tests/integration/run_files.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kappa::testing::ReadAll;
using kappa::testing::ServiceSpec;

constexpr auto kBound = std::chrono::seconds(10);

// Polls until `path` contains `text` or `timeout` passes.
bool AwaitText(const fs::path& path, const std::string& text, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (ReadAll(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(FaultTest, EveryServiceExitsPromptlyOnSigtermWhilePeersStallOrHoldStreams) {
  const auto test_start = Clock::now();
  const fs::path root = fs::temp_directory_path() / ("kappa-fault-shutdown-" + std::to_string(getpid()));
  fs::remove_all(root);
  const fs::path config = kappa::testing::WriteStandaloneRun(
      root,
      "{steps: 100000, groups_per_step: 2, group_size: 4, eval_every: 0, eval_examples: 4,"
      " checkpoint_every: 0}");
  kappa::cli::ProcessSupervisor supervisor;
  auto spawn = [&](const std::string& name, const std::string& binary,
                   std::vector<std::string> args) {
    absl::StatusOr<pid_t> pid = supervisor.Spawn(
        ServiceSpec(name, binary, config, std::move(args), root / (name + ".log")));
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? *pid : 0;
  };
  // A server binds port 0 and says which port in its ready file.
  auto serve = [&](const std::string& name, const std::string& binary,
                   std::vector<std::string> args) {
    args.push_back("--address");
    args.push_back(kappa::testing::kAnyLoopbackPort);
    absl::StatusOr<kappa::testing::ReadyService> started = kappa::testing::SpawnReady(
        supervisor, ServiceSpec(name, binary, config, std::move(args), root / (name + ".log")),
        root / (name + ".ready.json"));
    EXPECT_TRUE(started.ok()) << started.status();
    return started.ok() ? *started : kappa::testing::ReadyService{};
  };
  const kappa::testing::ReadyService teacher_service = serve("teacher", KAPPA_TEACHER, {});
  const kappa::testing::ReadyService verifier_service = serve("verifier", KAPPA_VERIFIER, {});
  const kappa::testing::ReadyService learner_service =
      serve("learner", KAPPA_LEARNER, {"--run-dir", (root / "run").string()});
  ASSERT_FALSE(HasFailure());
  const pid_t teacher = teacher_service.pid;
  const pid_t verifier = verifier_service.pid;
  const pid_t learner = learner_service.pid;
  const std::string& teacher_address = teacher_service.ready.address;
  const std::string& verifier_address = verifier_service.ready.address;
  const std::string& learner_address = learner_service.ready.address;
  std::vector<pid_t> workers;
  for (const char* id : {"worker-0", "worker-1"}) {
    workers.push_back(spawn(id, KAPPA_ROLLOUT_WORKER,
                            {"rollout.rpc_deadline_ms=500", "--worker-id", id, "--learner",
                             learner_address, "--teacher", teacher_address, "--verifier",
                             verifier_address}));
  }
  ASSERT_TRUE(AwaitText(root / "worker-1.log", "group sent", std::chrono::seconds(60)))
      << ReadAll(root / "worker-1.log");

  // A client that opens both learner streams and never reads from them.
  auto channel = grpc::CreateChannel(learner_address, grpc::InsecureChannelCredentials());
  auto stub = kappa::v1::Learner::NewStub(channel);
  grpc::ClientContext rollout_context, watch_context;
  auto rollout = stub->Rollout(&rollout_context);
  kappa::v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id("silent");
  hello.mutable_hello()->set_max_outstanding(4);
  ASSERT_TRUE(rollout->Write(hello));
  kappa::v1::WatchPolicyRequest watch_request;
  watch_request.set_known_version(-1);
  auto watch = stub->WatchPolicy(&watch_context, watch_request);

  // worker-1 frozen with its connections open.
  supervisor.Signal(workers[1], SIGSTOP);
  // worker-0 stuck retrying Verify against a frozen verifier.
  supervisor.Signal(verifier, SIGSTOP);
  ASSERT_TRUE(AwaitText(root / "worker-0.log", "Verifier.Verify for lease", std::chrono::seconds(30)))
      << ReadAll(root / "worker-0.log");
  const kappa::testing::TimedExit worker = kappa::testing::ExitAfterSigterm(supervisor, workers[0], kBound);
  supervisor.Signal(verifier, SIGCONT);
  const kappa::testing::TimedExit learner_exit =
      kappa::testing::ExitAfterSigterm(supervisor, learner, kBound);
  const kappa::testing::TimedExit teacher_exit =
      kappa::testing::ExitAfterSigterm(supervisor, teacher, kBound);
  const kappa::testing::TimedExit verifier_exit =
      kappa::testing::ExitAfterSigterm(supervisor, verifier, kBound);
  supervisor.Signal(workers[1], SIGKILL);
  supervisor.WaitFor(workers[1], std::chrono::seconds(10));
  rollout_context.TryCancel();
  watch_context.TryCancel();

  struct Row {
    const char* name;
    const kappa::testing::TimedExit& exit;
  };
  for (const Row& row : {Row{"worker-0", worker}, Row{"learner", learner_exit},
                         Row{"teacher", teacher_exit}, Row{"verifier", verifier_exit}}) {
    EXPECT_GE(row.exit.seconds, 0) << row.name << " still running " << kBound.count()
                                   << " s after SIGTERM\n"
                                   << ReadAll(root / (std::string(row.name) + ".log"));
    EXPECT_TRUE(row.exit.seconds < 0 || row.exit.status.success())
        << row.name << " " << row.exit.status.ToString();
    std::cout << row.name << " exited " << row.exit.seconds << " s after SIGTERM\n";
  }
  std::cout << "whole test " << std::chrono::duration<double>(Clock::now() - test_start).count()
            << " s\n";
  if (!HasFailure()) fs::remove_all(root);
}

}  // namespace
