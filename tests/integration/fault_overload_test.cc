// Fault: 16 clients flood one real learner (kappa-learner on loopback, 8
// buffer slots): 8 honest workers, 4 that sample with a policy far too old
// (version 0 forever) and 4 that send every group twice, each holding up to
// 16 work items. Memory must stay bounded (leased + buffered groups never
// above learner.buffer_groups, the process's resident memory flat), stale
// groups and copies must be dropped and counted, never silently (every
// accepted group is trained, counted as dropped, or still buffered), and
// training must finish every step with each lease once.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
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
using kappa::testing::ReadAll;

constexpr int kSteps = 30;
constexpr int kBufferGroups = 8;

// Resident set size of `pid` in MiB (VmRSS), 0 when it is gone.
double ResidentMiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// One sample of `name` (no labels) from a /metrics page; -1 when absent.
double Gauge(const std::string& page, const std::string& name) {
  std::smatch match;
  return std::regex_search(page, match, std::regex("\n" + name + " (\\S+)"))
             ? std::stod(match[1])
             : -1;
}

TEST(FaultTest, FloodedLearnerStaysBoundedAndCountsEveryDrop) {
  const auto test_start = Clock::now();
  const fs::path root = fs::temp_directory_path() / ("kappa-fault-overload-" + std::to_string(getpid()));
  fs::remove_all(root);
  const fs::path config = kappa::testing::WriteStandaloneRun(
      root, "{steps: " + std::to_string(kSteps) +
                ", groups_per_step: 3, group_size: 4, eval_every: 0, eval_examples: 4,"
                " checkpoint_every: 0}");
  const fs::path ready_file = root / "learner.ready.json";
  const fs::path run_dir = root / "run";
  kappa::cli::ProcessSupervisor supervisor;
  absl::StatusOr<pid_t> learner = supervisor.Spawn(kappa::testing::ServiceSpec(
      "learner", KAPPA_LEARNER, config,
      {"learner.buffer_groups=" + std::to_string(kBufferGroups), "learner.max_staleness=2",
       "--address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--ready-file",
       ready_file.string(), "--run-dir", run_dir.string()},
      root / "learner.log"));
  ASSERT_TRUE(learner.ok()) << learner.status();
  const absl::StatusOr<kappa::services::ReadyInfo> ready =
      kappa::testing::AwaitReadyFile(ready_file, std::chrono::seconds(60));
  ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << ReadAll(root / "learner.log");
  const std::string address = ready->address, metrics_address = ready->metrics_address;
  ASSERT_TRUE(kappa::testing::AwaitServing(address, std::chrono::seconds(60)))
      << ReadAll(root / "learner.log");
  const double rss_idle = ResidentMiB(*learner);

  std::vector<std::unique_ptr<kappa::testing::FakeWorker>> workers;
  for (int i = 0; i < 16; ++i) {
    kappa::testing::FakeWorkerOptions options;
    options.worker_id = "flood-" + std::to_string(i);
    options.max_outstanding = 16;
    if (i % 4 == 1) options.report_version = 0;  // stale once the policy is past version 2
    if (i % 4 == 3) options.send_twice = true;
    workers.push_back(std::make_unique<kappa::testing::FakeWorker>(
        kappa::testing::FastReconnectChannel(address), options));
  }
  // The clients that send copies go first and the flood waits until each has
  // sent a group: which waiting stream gets a free slot is up to the
  // scheduler, and twelve others could otherwise take every lease.
  for (int i = 3; i < 16; i += 4) workers[i]->Start();
  for (int i = 3; i < 16; i += 4) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (workers[i]->stats().groups_sent == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GT(workers[i]->stats().groups_sent, 0) << ReadAll(root / "learner.log");
  }
  for (int i = 0; i < 16; ++i) {
    if (i % 4 != 3) workers[i]->Start();
  }

  // While the flood lasts: slots in use, and resident memory.
  double max_slots = 0, max_rss = rss_idle, rss_at_step_5 = 0;
  int scrapes = 0;
  std::optional<kappa::cli::ExitStatus> exit;
  while (!exit && Clock::now() - test_start < std::chrono::seconds(120)) {
    const std::string page = kappa::testing::HttpGet(metrics_address, "/metrics").body;
    const double buffered = Gauge(page, "kappa_learner_buffer_groups");
    const double outstanding = Gauge(page, "kappa_learner_outstanding_leases");
    if (buffered >= 0 && outstanding >= 0) {
      max_slots = std::max(max_slots, buffered + outstanding);
      ++scrapes;
    }
    const double rss = ResidentMiB(*learner);
    max_rss = std::max(max_rss, rss);
    if (rss_at_step_5 == 0 && Gauge(page, "kappa_learner_step") >= 5) rss_at_step_5 = rss;
    exit = supervisor.WaitFor(*learner, std::chrono::milliseconds(20));
  }
  int64_t sent = 0;
  for (auto& worker : workers) {
    worker->Stop();
    sent += worker->stats().groups_sent;
  }
  ASSERT_TRUE(exit.has_value()) << ReadAll(root / "learner.log");
  EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << ReadAll(root / "learner.log");

  std::set<std::string> leases;
  nlohmann::json last;
  for (const nlohmann::json& record : kappa::testing::StepRecords(run_dir / "metrics.jsonl")) {
    if (record.value("step", 0) == 0) continue;
    EXPECT_LE(record["buffer_groups"].get<int>(), kBufferGroups);
    for (const auto& id : record["lease_ids"]) {
      EXPECT_TRUE(leases.insert(id.get<std::string>()).second) << "lease trained twice: " << id;
    }
    last = record;
  }
  ASSERT_EQ(last.value("step", 0), kSteps);
  EXPECT_EQ(leases.size(), static_cast<size_t>(3 * kSteps));
  EXPECT_GT(scrapes, 0);
  EXPECT_LE(max_slots, kBufferGroups) << "leased + buffered groups exceeded learner.buffer_groups";
  const int64_t accepted = last["groups_accepted"], consumed = last["groups_consumed"],
                stale = last["groups_dropped_stale"], duplicates = last["groups_dropped_duplicate"],
                unknown = last["groups_dropped_unknown_lease"], buffered = last["buffer_groups"];
  EXPECT_GT(stale, 0) << "the stale workers' groups were not dropped as stale";
  EXPECT_GT(duplicates, 0) << "the copies were not dropped as duplicates";
  // Nothing vanishes: every accepted group was trained on, dropped as stale
  // (and counted), or is still in the buffer.
  EXPECT_EQ(accepted, consumed + stale + buffered);
  // Memory does not grow with the number of groups pushed at the learner.
  EXPECT_LT(max_rss - rss_idle, 256.0) << "resident memory grew under the flood";
  if (rss_at_step_5 > 0) {
    EXPECT_LT(max_rss - rss_at_step_5, 32.0);
  }
  std::cout << sent << " groups sent by 16 clients; learner accepted " << accepted << ", trained "
            << consumed << ", dropped " << stale << " stale, " << duplicates << " copies and "
            << unknown << " for unknown leases; max leased+buffered " << max_slots << "/"
            << kBufferGroups << "; RSS " << rss_idle << " MiB idle, " << rss_at_step_5
            << " at step 5, max " << max_rss << " MiB; "
            << std::chrono::duration<double>(Clock::now() - test_start).count() << " s\n";
  if (!HasFailure()) fs::remove_all(root);
}

}  // namespace
