// Fault: the learner's run directory is a small tmpfs that fills up between
// two checkpoints. A real kappa-learner driven by in-process fake workers:
// the checkpoint that meets the full disk fails, `latest` still names the
// previous complete checkpoint, the learner says so in its log and in
// kappa_learner_write_failures_total, and training goes on. Once space is
// back, the next checkpoint lands and the step records that waited are
// written: metrics.jsonl ends with every step once and no torn line.
// (Root only, to mount the tmpfs; skipped with the reason otherwise.)
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
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

constexpr int kSteps = 16;
constexpr int kCheckpointEvery = 4;

std::string Latest(const fs::path& run_dir) {
  std::ifstream in(run_dir / "checkpoints" / "latest");
  std::string name;
  in >> name;
  return name;
}

// Polls `ready` until `timeout`; false when nothing came.
bool WaitFor(const std::function<bool()>& ready, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Fills the file system under `dir` to the last byte.
void Fill(const fs::path& dir) {
  std::ofstream filler(dir / "filler", std::ios::binary);
  const std::string block(4096, 'f');
  while (filler.write(block.data(), block.size())) filler.flush();
}

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
    root_ = fs::temp_directory_path() / ("kappa-fault-disk-full-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    run_dir_ = root_ / "run";
    fs::create_directories(run_dir_);
    if (::mount("tmpfs", run_dir_.c_str(), "tmpfs", 0, "size=4m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs: " << std::strerror(errno);
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2(run_dir_.c_str(), MNT_DETACH);
    if (!HasFailure()) fs::remove_all(root_);
  }

  fs::path root_, run_dir_;
  bool mounted_ = false;
};

TEST_F(DiskFullTest, AFailedCheckpointKeepsTheLastOneAndTrainingGoesOn) {
  const fs::path config = kappa::testing::WriteStandaloneRun(
      root_, "{steps: " + std::to_string(kSteps) +
                 ", groups_per_step: 2, group_size: 4, eval_every: 0, eval_examples: 4,"
                 " checkpoint_every: " +
                 std::to_string(kCheckpointEvery) + "}");
  const fs::path ready_file = root_ / "learner.ready.json";
  kappa::cli::ProcessSupervisor supervisor;
  absl::StatusOr<pid_t> learner = supervisor.Spawn(kappa::testing::ServiceSpec(
      "learner", KAPPA_LEARNER, config,
      {"--address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--ready-file",
       ready_file.string(), "--run-dir", run_dir_.string()},
      root_ / "learner.log"));
  ASSERT_TRUE(learner.ok()) << learner.status();
  const absl::StatusOr<kappa::services::ReadyInfo> ready =
      kappa::testing::AwaitReadyFile(ready_file, std::chrono::seconds(60));
  ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << ReadAll(root_ / "learner.log");

  // Slow enough that the test acts between two checkpoints.
  kappa::testing::FakeWorkerOptions options;
  options.max_outstanding = 2;
  options.sample_time = std::chrono::milliseconds(150);
  std::vector<std::unique_ptr<kappa::testing::FakeWorker>> workers;
  for (int i = 0; i < 2; ++i) {
    options.worker_id = "disk-" + std::to_string(i);
    workers.push_back(std::make_unique<kappa::testing::FakeWorker>(
        kappa::testing::FastReconnectChannel(ready->address), options));
    workers.back()->Start();
  }

  // The first checkpoint lands; then the disk fills before the second.
  ASSERT_TRUE(WaitFor([&] { return Latest(run_dir_) == "step-4"; }, std::chrono::seconds(60)))
      << ReadAll(root_ / "learner.log");
  Fill(run_dir_);
  const std::regex failed(
      "checkpoint at step (\\d+) failed: .*No space left on device.*"
      "checkpoints/latest still names step-4");
  std::smatch match;
  std::string log;
  ASSERT_TRUE(WaitFor(
      [&] { return std::regex_search(log = ReadAll(root_ / "learner.log"), match, failed); },
      std::chrono::seconds(60)))
      << log;
  const int failed_step = std::stoi(match[1]);
  EXPECT_EQ(failed_step % kCheckpointEvery, 0);
  EXPECT_EQ(Latest(run_dir_), "step-4");
  EXPECT_FALSE(fs::exists(run_dir_ / "checkpoints" / ("step-" + std::to_string(failed_step))))
      << "the failed checkpoint's remains were not removed";
  const std::string page = kappa::testing::HttpGet(ready->metrics_address, "/metrics").body;
  EXPECT_NE(page.find("kappa_learner_write_failures_total{what=\"checkpoint\"} 1"),
            std::string::npos)
      << page;

  // Space comes back: training went on, and the next checkpoints land.
  fs::remove(run_dir_ / "filler");
  std::optional<kappa::cli::ExitStatus> exit =
      supervisor.WaitFor(*learner, std::chrono::seconds(90));
  for (auto& worker : workers) worker->Stop();
  ASSERT_TRUE(exit.has_value()) << ReadAll(root_ / "learner.log");
  EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << ReadAll(root_ / "learner.log");
  EXPECT_EQ(Latest(run_dir_), "step-" + std::to_string(kSteps));

  // metrics.jsonl: every line whole, every step once and in order, also the
  // ones logged while the disk was full.
  std::ifstream in(run_dir_ / "metrics.jsonl");
  std::string line;
  std::vector<int> steps;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(record.is_discarded()) << "torn line in metrics.jsonl: " << line.substr(0, 200);
    if (record.contains("lease_ids")) steps.push_back(record["step"].get<int>());
  }
  std::vector<int> expected;
  for (int s = 1; s <= kSteps; ++s) expected.push_back(s);
  EXPECT_EQ(steps, expected);
  std::cout << "checkpoint at step " << failed_step << " met the full disk; latest stayed step-4; "
            << "run finished with latest " << Latest(run_dir_) << "\n";
}

}  // namespace
