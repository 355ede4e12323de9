// Fault: in a real `kappa run` (learner, teacher, verifier, two workers on
// loopback) the verifier, then the teacher, stalls (SIGSTOP: connections are
// accepted, nothing answers) for a few seconds and comes back (SIGCONT);
// then the teacher is SIGKILLed and `kappa run` restarts it. Workers must
// retry under their per-call deadline (rollout.rpc_deadline_ms) with backoff,
// count every failed attempt in kappa_worker_rpc_errors_total{peer=...} and
// log it, never crash, never send a group without rewards or teacher
// log-probs, and training must resume by itself: every step trained, each
// group once, none rejected by the learner.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/process_supervisor.h"
#include "tests/integration/run_files.h"
#include "tests/integration/tiny_run_config.h"
#include "tests/services/http_get.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kappa::testing::FindProcess;
using kappa::testing::ReadAll;
using kappa::testing::StepRecords;

constexpr int kSteps = 40;
constexpr int kWorkers = 2;

int LastStep(const fs::path& metrics) {
  int step = 0;
  for (const nlohmann::json& record : StepRecords(metrics)) {
    step = std::max(step, record.value("step", 0));
  }
  return step;
}

// The workers' /metrics addresses, from the run's prometheus.yml.
std::vector<std::string> WorkerMetricsAddresses(const fs::path& prometheus_yml) {
  std::vector<std::string> addresses;
  std::istringstream in(ReadAll(prometheus_yml));
  std::string line, job;
  std::smatch match;
  while (std::getline(in, line)) {
    if (std::regex_search(line, match, std::regex(R"(job_name:\s*(\S+))"))) job = match[1];
    if (job == "kappa-rollout" &&
        std::regex_search(line, match, std::regex(R"re(targets:\s*\["([^"]+)"\])re"))) {
      addresses.push_back(match[1]);
    }
  }
  return addresses;
}

// kappa_worker_rpc_errors_total{peer="<peer>"} summed over the workers (a
// worker not answering counts 0).
double RpcErrors(const std::vector<std::string>& workers, const std::string& peer) {
  double total = 0;
  const std::regex sample("^kappa_worker_rpc_errors_total\\{peer=\"" + peer + "\"\\} (\\S+)$");
  for (const std::string& address : workers) {
    std::istringstream in(kappa::testing::HttpGet(address, "/metrics").body);
    std::string line;
    std::smatch match;
    while (std::getline(in, line)) {
      if (std::regex_match(line, match, sample)) total += std::stod(match[1]);
    }
  }
  return total;
}

// Stops `pid` until the workers have counted at least `attempts` more failed
// calls to `peer` and at least `min_outage` has passed, then continues it.
// Returns the outage's length in seconds (-1: the errors never showed).
double Stall(pid_t pid, const std::vector<std::string>& workers, const std::string& peer,
             double attempts, std::chrono::milliseconds min_outage) {
  const double before = RpcErrors(workers, peer);
  const auto start = Clock::now();
  ::kill(pid, SIGSTOP);
  bool counted = false;
  while (Clock::now() - start < std::chrono::seconds(30)) {
    counted = RpcErrors(workers, peer) >= before + attempts;
    if (counted && Clock::now() - start >= min_outage) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGCONT);
  return counted ? std::chrono::duration<double>(Clock::now() - start).count() : -1;
}

TEST(FaultTest, StalledOrKilledTeacherAndVerifierCostTimeButNoData) {
  const auto test_start = Clock::now();
  const fs::path root = fs::temp_directory_path() / ("kappa-fault-outage-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path config = root / "outage.yaml";
  std::ofstream(config) << kappa::testing::TinyRunConfig(
      "outage", root.string(), kWorkers,
      "{steps: " + std::to_string(kSteps) +
          ", groups_per_step: 3, group_size: 4, eval_every: 0, eval_examples: 10,\n"
          "          checkpoint_every: 0}");

  kappa::cli::ProcessSupervisor supervisor;
  kappa::cli::ProcessSpec run;
  run.name = "kappa-run";
  // A short per-call deadline, so a stalled peer shows up as failed attempts
  // within the outage.
  run.argv = {KAPPA_CLI, "run", config.string(), "--no-progress", "rollout.rpc_deadline_ms=400"};
  run.log_file = (root / "kappa.out").string();
  auto run_pid = supervisor.Spawn(run);
  ASSERT_TRUE(run_pid.ok()) << run_pid.status();

  const fs::path run_dir = root / "runs" / "outage";
  const fs::path metrics = run_dir / "metrics.jsonl";
  auto deadline = Clock::now() + std::chrono::seconds(120);
  while (LastStep(metrics) < 3 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(LastStep(metrics), 3) << ReadAll(root / "kappa.out");
  // kappa run writes prometheus.yml once every worker has reported its port,
  // which can be a moment after the first steps of a run this small.
  std::vector<std::string> workers;
  deadline = Clock::now() + std::chrono::seconds(30);
  while ((workers = WorkerMetricsAddresses(run_dir / "prometheus.yml")).size() <
             static_cast<size_t>(kWorkers) &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(workers.size(), static_cast<size_t>(kWorkers)) << ReadAll(run_dir / "prometheus.yml");
  const std::string config_yaml = (run_dir / "config.yaml").string();
  const pid_t verifier = FindProcess("kappa-verifier --config " + config_yaml);
  const pid_t teacher = FindProcess("kappa-teacher --config " + config_yaml);
  ASSERT_GT(verifier, 0);
  ASSERT_GT(teacher, 0);

  const int step_before = LastStep(metrics);
  const double verifier_outage =
      Stall(verifier, workers, "verifier", 2, std::chrono::milliseconds(2000));
  EXPECT_GT(verifier_outage, 0) << "no failed Verify attempt counted while the verifier stalled";
  const double teacher_outage =
      Stall(teacher, workers, "teacher", 2, std::chrono::milliseconds(2000));
  EXPECT_GT(teacher_outage, 0) << "no failed Score attempt counted while the teacher stalled";
  const int step_after_stalls = LastStep(metrics);
  ASSERT_LT(step_after_stalls, kSteps) << "the run ended before the teacher was killed";
  ::kill(teacher, SIGKILL);

  std::optional<kappa::cli::ExitStatus> exit =
      supervisor.WaitFor(*run_pid, std::chrono::seconds(180));
  ASSERT_TRUE(exit.has_value()) << "kappa run did not finish\n" << ReadAll(root / "kappa.out");
  const std::string out = ReadAll(root / "kappa.out");
  EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << out;
  EXPECT_NE(out.find("teacher killed by signal 9"), std::string::npos) << out;
  EXPECT_NE(out.find("processes restarted after dying: 1"), std::string::npos) << out;

  // Every step trained, each group once; the learner rejected none.
  const kappa::testing::TrainedGroups trained = kappa::testing::ReadTrainedGroups(metrics);
  EXPECT_TRUE(trained.repeated.empty()) << "leases trained twice: " << trained.repeated.size();
  EXPECT_EQ(trained.steps, kSteps);
  EXPECT_EQ(trained.leases.size(), static_cast<size_t>(3 * kSteps));
  const std::string learner_log = ReadAll(run_dir / "logs" / "learner.log");
  EXPECT_EQ(learner_log.find("rejected group"), std::string::npos) << learner_log;
  // The outage is in the workers' logs too, and both stopped cleanly.
  std::string worker_logs;
  for (int i = 0; i < kWorkers; ++i) {
    const std::string log = ReadAll(run_dir / "logs" / ("rollout-" + std::to_string(i) + ".log"));
    EXPECT_NE(log.find("stopped:"), std::string::npos) << log;
    worker_logs += log;
  }
  EXPECT_NE(worker_logs.find("Verifier.Verify for lease"), std::string::npos);
  EXPECT_NE(worker_logs.find("Teacher.Score for lease"), std::string::npos);
  std::cout << "verifier stalled " << verifier_outage << " s, teacher stalled " << teacher_outage
            << " s (steps " << step_before << " -> " << step_after_stalls
            << "), then teacher killed and restarted; " << trained.steps << "/" << kSteps
            << " steps trained, " << trained.leases.size() << " distinct leases; "
            << std::chrono::duration<double>(Clock::now() - test_start).count() << " s\n";
  fs::remove_all(root);
}

}  // namespace
