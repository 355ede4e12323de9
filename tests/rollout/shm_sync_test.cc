// Same-host weight sync through shared memory (issue 38, item 3): the
// segment format and its store, the real LearnerService + PolicyWatcher in
// one process, and two-process runs against shm_sync_fixture (a version
// swapped while the worker samples, a worker SIGKILLed mid-copy, a learner
// SIGKILLed and restarted), each ending with no kappa-* segment of its
// processes left in /dev/shm.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dist/shm_segment.h"
#include "kappa/v1/learner.grpc.pb.h"
#include "learner/coordinator.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/shm_policy.h"
#include "learner/work_config.h"
#include "rollout_worker/policy_watcher.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "tests/rollout/shm_test_util.h"

namespace kappa::rollout {
namespace {

using dist::OpenShmSegmentFor;
using dist::ShmContent;
using dist::WriteShmSegment;
using learner::PolicyPublisher;
using learner::PublisherOptions;
using learner::ShmPolicyStore;
using testing::Checksum;
using testing::Eventually;
using testing::ExpectModelHolds;
using testing::kWait;
using testing::ModelChecksum;
using testing::ShmSegmentsOf;
using testing::Snapshot;
using testing::TinyConfig;
using testing::VersionWeights;
using testing::Weights;
using Shm = WeightSyncOptions::Shm;

std::vector<std::pair<std::string, torch::Tensor>> Ordered(const Weights& weights) {
  return {weights.begin(), weights.end()};
}

// A private tmpfs-like directory for the format tests (on /dev/shm itself).
class ShmDir {
 public:
  ShmDir() {
    char path[] = "/dev/shm/kappa_test_XXXXXX";
    dir_ = mkdtemp(path);
  }
  ~ShmDir() {
    for (const std::string& name : testing::ShmSegments(dir_)) unlink((dir_ + "/" + name).c_str());
    rmdir(dir_.c_str());
  }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
};

// ------------------------------------------------------------ the format

TEST(ShmSegmentTest, AWrittenSegmentReadsBackConvertedBitForBit) {
  ShmDir dir;
  const Weights weights = VersionWeights(0);
  const auto ordered = Ordered(weights);
  dist::ShmContent content{3, 77, TinyConfig().ToJson(), torch::kBFloat16, &ordered};
  auto segment = dist::WriteShmSegment(dir.path(), "kappa-1-a-v3-bf16", content);
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto opened =
      dist::OpenShmSegmentFor((*segment)->path(), (*segment)->bytes(), (*segment)->token(), 3, 77);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->manifest().model_config_json(), TinyConfig().ToJson());
  // Read into float32 tensors (converting) and into bfloat16 ones (direct).
  std::vector<std::pair<torch::Tensor, int>> into_fp32, into_bf16;
  for (int i = 0; i < (*opened)->manifest().parameters_size(); ++i) {
    const torch::Tensor& source = weights.at((*opened)->manifest().parameters(i).name());
    into_fp32.emplace_back(torch::empty(source.sizes(), torch::kFloat32), i);
    into_bf16.emplace_back(torch::empty(source.sizes(), torch::kBFloat16), i);
  }
  ASSERT_TRUE((*opened)->ReadInto(into_fp32).ok());
  ASSERT_TRUE((*opened)->ReadInto(into_bf16).ok());
  for (size_t i = 0; i < into_fp32.size(); ++i) {
    const torch::Tensor want =
        weights.at((*opened)->manifest().parameters(i).name()).to(torch::kBFloat16);
    EXPECT_TRUE(testing::SameBytes(into_bf16[i].first, want));
    EXPECT_TRUE(testing::SameBytes(into_fp32[i].first, want.to(torch::kFloat32)));
    // The learner's own views (what gRPC streams send) hold the same bytes.
    EXPECT_TRUE(testing::SameBytes((*segment)->views()[i].second,
                                   weights.at((*segment)->views()[i].first).to(torch::kBFloat16)));
  }
}

TEST(ShmSegmentTest, AnotherTokenSizeOrAGoneFileIsRefusedByName) {
  ShmDir dir;
  const auto ordered = Ordered(VersionWeights(0));
  dist::ShmContent content{1, 5, TinyConfig().ToJson(), torch::kFloat32, &ordered};
  auto segment = dist::WriteShmSegment(dir.path(), "kappa-1-a-v1-f32", content);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const std::string& path = (*segment)->path();
  const int64_t bytes = (*segment)->bytes();
  const uint64_t token = (*segment)->token();
  EXPECT_TRUE(dist::OpenShmSegmentFor(path, bytes, token, 1, 5).ok());
  EXPECT_EQ(dist::OpenShmSegmentFor(path, bytes, token + 1, 1, 5).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(dist::OpenShmSegmentFor(path, bytes, token, 2, 5).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(dist::OpenShmSegmentFor(path, bytes - 1, token, 1, 5).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(dist::OpenShmSegmentFor(dir.path() + "/passwd", bytes, token, 1, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(unlink(path.c_str()), 0);
  EXPECT_EQ(dist::OpenShmSegmentFor(path, bytes, token, 1, 5).status().code(),
            absl::StatusCode::kNotFound);
}

// ------------------------------------------------------------ the store

TEST(ShmPolicyStoreTest, KeepsTheLatestTwoVersionsAndUnlinksAllAtTheEnd) {
  ShmDir dir;
  const auto ordered = Ordered(VersionWeights(0));
  {
    ShmPolicyStore store(dir.path());
    ASSERT_FALSE(store.host_key().empty());
    for (int64_t v = 0; v < 4; ++v) {
      dist::ShmContent content{v, 1, "{}", torch::kFloat32, &ordered};
      ASSERT_TRUE(store.Write(content).ok());
      EXPECT_EQ(ShmSegmentsOf(getpid(), dir.path()).size(), std::min<size_t>(v + 1, 2)) << v;
    }
    const std::vector<std::string> linked = store.linked();
    ASSERT_EQ(linked.size(), 2u);
    EXPECT_NE(linked[0].find("-v2-"), std::string::npos) << linked[0];
    EXPECT_NE(linked[1].find("-v3-"), std::string::npos) << linked[1];
    // A version two behind the newest gets no segment.
    dist::ShmContent stale{1, 1, "{}", torch::kFloat32, &ordered};
    EXPECT_EQ(store.Write(stale).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(ShmSegmentsOf(getpid(), dir.path()).empty());
}

TEST(ShmPolicyStoreTest, ANewStoreSweepsDeadLearnersSegmentsOnly) {
  ShmDir dir;
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // `child` is now a dead pid
  const std::string dead = dir.path() + "/kappa-" + std::to_string(child) + "-ab-v1-bf16";
  const std::string alive = dir.path() + "/kappa-" + std::to_string(getpid()) + "-cd-v1-bf16";
  const std::string other = dir.path() + "/kappa-notapid";
  for (const std::string& path : {dead, alive, other}) std::ofstream(path) << "x";
  ShmPolicyStore store(dir.path());
  EXPECT_NE(access(dead.c_str(), F_OK), 0);
  EXPECT_EQ(access(alive.c_str(), F_OK), 0);
  EXPECT_EQ(access(other.c_str(), F_OK), 0);
  unlink(alive.c_str());
  unlink(other.c_str());
}

// A dead learner's pid, reused by a process that started after its last
// segment was written: the segment is swept though the pid is alive. Here
// the "reused" pid is this test's own, and the segment's write time is set
// to before this process started.
TEST(ShmPolicyStoreTest, ASegmentOlderThanTheProcessNowHoldingItsPidIsSwept) {
  const std::optional<double> started = dist::ProcessStartSeconds(getpid());
  ASSERT_TRUE(started.has_value());
  EXPECT_LE(*started, static_cast<double>(time(nullptr)) + 1);
  EXPECT_GT(*started, static_cast<double>(time(nullptr)) - 24 * 3600 * 365);
  ShmDir dir;
  const std::string stale = dir.path() + "/kappa-" + std::to_string(getpid()) + "-ab-v1-bf16";
  const std::string current = dir.path() + "/kappa-" + std::to_string(getpid()) + "-cd-v2-bf16";
  for (const std::string& path : {stale, current}) std::ofstream(path) << "x";
  const timespec before_start[2] = {{static_cast<time_t>(*started) - 60, 0},
                                    {static_cast<time_t>(*started) - 60, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, stale.c_str(), before_start, 0), 0);
  EXPECT_EQ(dist::SweepDeadShmSegments(dir.path()), 1);
  EXPECT_NE(access(stale.c_str(), F_OK), 0) << "a segment older than its pid's process stayed";
  EXPECT_EQ(access(current.c_str(), F_OK), 0) << "the live learner's own segment went";
  unlink(current.c_str());
}

// ------------------------------------------------------------ one process

class ShmSyncTest : public ::testing::Test {
 protected:
  void Serve(PublisherOptions options = {}) {
    publisher_ = std::make_unique<PolicyPublisher>(options);
    learner::WorkTemplate work;
    work.group_size = 2;
    work.max_new_tokens = 4;
    work.max_outstanding_limit = 4;
    coordinator_ = std::make_unique<learner::Coordinator>(1, 1, 0, learner::CoordinatorOptions{});
    service_ = std::make_unique<learner::LearnerService>(
        dataset_, [](size_t) { return std::vector<int32_t>{1}; }, work,
        learner::GroupExpectationsFor(work, 51), coordinator_.get(), publisher_.get());
    auto server = services::GrpcServer::Start("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    if (service_) service_->Shutdown();
    if (publisher_) publisher_->Shutdown();
    if (server_) server_->Shutdown(absl::Milliseconds(200));
    EXPECT_TRUE(ShmSegmentsOf(getpid()).empty()) << "segments left behind";
  }
  std::unique_ptr<PolicyWatcher> Watcher(c10::ScalarType dtype, WeightSyncOptions sync,
                                         PolicyWatcherOptions options = {"w"}) {
    options.initial_backoff = absl::Milliseconds(20);
    options.max_backoff = absl::Milliseconds(200);
    options.dtype = dtype;
    auto watcher = std::make_unique<PolicyWatcher>(services::MakeChannel(address_), options, sync);
    watcher->Start();
    return watcher;
  }
  static WeightSyncOptions Sync(c10::ScalarType wire, Shm shm, std::string dir = "/dev/shm") {
    WeightSyncOptions sync{wire, false, false};
    sync.shm = shm;
    sync.shm_dir = std::move(dir);
    return sync;
  }

  testing::EmptyDataset dataset_;
  std::unique_ptr<PolicyPublisher> publisher_;
  std::unique_ptr<learner::Coordinator> coordinator_;
  std::unique_ptr<learner::LearnerService> service_;
  std::unique_ptr<services::GrpcServer> server_;
  std::string address_;
};

TEST_F(ShmSyncTest, SameHostWorkersShareOneSegmentPerVersionAndDtype) {
  Serve();
  const Weights v0 = VersionWeights(0);
  publisher_->Publish(Snapshot(0, v0));
  auto fp32 = Watcher(torch::kFloat32, Sync(torch::kFloat32, Shm::kRequired));
  auto bf16_into_fp32 = Watcher(torch::kFloat32, Sync(torch::kBFloat16, Shm::kAuto));
  auto bf16 = Watcher(torch::kBFloat16, Sync(torch::kBFloat16, Shm::kRequired));
  for (PolicyWatcher* watcher : {fp32.get(), bf16_into_fp32.get(), bf16.get()}) {
    ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());
    EXPECT_EQ(watcher->shm_versions(), 1);
  }
  ExpectModelHolds(*fp32->Current().model, v0, torch::kFloat32);
  ExpectModelHolds(*bf16_into_fp32->Current().model, v0, torch::kBFloat16);
  ExpectModelHolds(*bf16->Current().model, v0, torch::kBFloat16);
  // Two segments (float32, bfloat16) for three workers; one conversion each.
  EXPECT_EQ(publisher_->shm_store()->segments_written(), 2);
  EXPECT_EQ(publisher_->encodings_made(), 2);
  // Counted after each Write returns, which a worker may outrun.
  EXPECT_TRUE(Eventually([&] { return service_->counters().policy_versions_shm.load() == 3; }));
  EXPECT_EQ(service_->counters().policy_versions_shm.load(), 3);
  EXPECT_EQ(service_->counters().policy_bytes_full.load(), 0);

  const Weights v1 = VersionWeights(1);
  publisher_->Publish(Snapshot(1, v1));
  ASSERT_TRUE(fp32->WaitForVersion(1, absl::Now() + kWait).ok());
  ExpectModelHolds(*fp32->Current().model, v1, torch::kFloat32);
  EXPECT_EQ(fp32->shm_versions(), 2);
}

TEST_F(ShmSyncTest, AWorkerOnAnotherShmGetsChunksWithAutoAndIsRefusedWithShm) {
  Serve();
  publisher_->Publish(Snapshot(0, VersionWeights(0)));
  // /tmp stands for another host's /dev/shm: another device and inode.
  auto automatic = Watcher(torch::kFloat32, Sync(torch::kFloat32, Shm::kAuto, "/tmp"));
  ASSERT_TRUE(automatic->WaitForVersion(0, absl::Now() + kWait).ok());
  EXPECT_EQ(automatic->shm_versions(), 0);
  ExpectModelHolds(*automatic->Current().model, VersionWeights(0), torch::kFloat32);

  auto required = Watcher(torch::kFloat32, Sync(torch::kFloat32, Shm::kRequired, "/tmp"));
  absl::StatusOr<Policy> refused = required->WaitForVersion(0, absl::Now() + kWait);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("rollout.weight_transport"), std::string::npos)
      << refused.status();
  EXPECT_EQ(required->fatal_status().code(), absl::StatusCode::kFailedPrecondition);
}

// (A name that is none of them is refused when the configuration loads:
// services_config_test's EveryNamedChoiceRefusesAnUnknownValueByName.)
TEST(ShmSettingsTest, WeightTransportValuesSetTheSyncOptions) {
  using services::WeightTransport;
  WeightSyncOptions sync;
  SetWeightTransport(WeightTransport::kShm, &sync);
  EXPECT_EQ(sync.shm, Shm::kRequired);
  SetWeightTransport(WeightTransport::kAuto, &sync);
  EXPECT_EQ(sync.shm, Shm::kAuto);
  EXPECT_FALSE(sync.c10d);
  SetWeightTransport(WeightTransport::kC10d, &sync);
  EXPECT_EQ(sync.shm, Shm::kOff);
  EXPECT_TRUE(sync.c10d);
  SetWeightTransport(WeightTransport::kGrpc, &sync);
  EXPECT_EQ(sync.shm, Shm::kOff);
  EXPECT_FALSE(sync.c10d);
}

// A full /dev/shm (Docker's default is 64 MiB): the learner's write fails
// with ENOSPC, it is counted, and the worker gets the version as chunks.
// Needs a tmpfs small enough to fill: mounted here when allowed (root).
TEST_F(ShmSyncTest, AFullShmFallsBackToChunks) {
  char path[] = "/tmp/kappa_tiny_shm_XXXXXX";
  const std::string dir = mkdtemp(path);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=16k") != 0) {
    rmdir(dir.c_str());
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno) << ")";
  }
  PublisherOptions options;
  options.shm_dir = dir;
  Serve(options);
  publisher_->Publish(Snapshot(0, VersionWeights(0)));
  auto watcher = Watcher(torch::kFloat32, Sync(torch::kFloat32, Shm::kRequired, dir));
  ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());
  ExpectModelHolds(*watcher->Current().model, VersionWeights(0), torch::kFloat32);
  EXPECT_EQ(watcher->shm_versions(), 0);
  EXPECT_EQ(service_->counters().policy_shm_fallbacks.load(), 1);
  EXPECT_TRUE(testing::ShmSegments(dir).empty());
  service_->Shutdown();
  publisher_->Shutdown();
  server_->Shutdown(absl::Milliseconds(200));
  server_.reset();
  umount(dir.c_str());
  rmdir(dir.c_str());
}

// A segment the worker cannot use (here: unlinked between the learner's
// write and the worker's open) rejects the version once, is counted, and
// the stream after it takes the version as chunks.
TEST_F(ShmSyncTest, ASegmentGoneBeforeTheOpenFallsBackToChunks) {
  Serve();
  const Weights v0 = VersionWeights(0);
  publisher_->Publish(Snapshot(0, v0));
  // Write the published version's segment (as a first stream would), then
  // unlink it behind the learner's back.
  const auto latest = publisher_->WaitNewer(-1, absl::Now() + kWait);
  ASSERT_TRUE(publisher_->Shm(latest, torch::kFloat32).ok());
  for (const std::string& name : ShmSegmentsOf(getpid())) unlink(("/dev/shm/" + name).c_str());
  auto watcher = Watcher(torch::kFloat32, Sync(torch::kFloat32, Shm::kRequired));
  ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());
  EXPECT_EQ(watcher->shm_failures(), 1);
  EXPECT_EQ(watcher->rejected_versions(), 1);
  EXPECT_EQ(watcher->shm_versions(), 0);
  ExpectModelHolds(*watcher->Current().model, v0, torch::kFloat32);
}

// ------------------------------------------------------------ two processes

// A child process with a pipe to its stdin and one from its stdout.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int in[2], out[2];
    EXPECT_EQ(pipe(in), 0);
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      std::vector<char*> args;
      for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~Child() {
    Kill();
    close(stdin_);
    close(stdout_);
  }
  int pid() const { return pid_; }
  void Send(const std::string& line) {
    const std::string text = line + "\n";
    EXPECT_EQ(write(stdin_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  // The next output line starting with `prefix` (others skipped); "" on timeout or EOF.
  std::string ReadLine(const std::string& prefix, absl::Duration timeout = kWait) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        if (line.rfind(prefix, 0) == 0) return line;
        continue;
      }
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left <= 0) return "";
      pollfd fd{stdout_, POLLIN, 0};
      if (poll(&fd, 1, static_cast<int>(left)) <= 0) return "";
      char chunk[4096];
      const ssize_t n = read(stdout_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Closes its stdin (the learner fixture then shuts down) and waits.
  int Finish() {
    close(stdin_);
    stdin_ = -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  int pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string buffer_;
};

class ShmProcessTest : public ::testing::Test {
 protected:
  // A learner fixture process and its address.
  std::unique_ptr<Child> StartLearner(std::string* address) {
    const std::string port_file =
        absl::StrCat(::testing::TempDir(), "/shm_learner_", getpid(), "_", starts_++);
    unlink(port_file.c_str());
    auto learner = std::make_unique<Child>(
        std::vector<std::string>{KAPPA_SHM_SYNC_FIXTURE, "learner", port_file});
    EXPECT_TRUE(Eventually([&] { return access(port_file.c_str(), F_OK) == 0; }));
    std::ifstream in(port_file);
    int port = 0;
    in >> port;
    *address = absl::StrCat("127.0.0.1:", port);
    return learner;
  }
  void Publish(Child& learner, int64_t version) {
    learner.Send(absl::StrCat("publish ", version));
    ASSERT_EQ(learner.ReadLine("published"), absl::StrCat("published ", version));
  }
  std::unique_ptr<PolicyWatcher> Watcher(const std::string& address,
                                         PolicyWatcherOptions options = {"test"}) {
    options.initial_backoff = absl::Milliseconds(20);
    options.max_backoff = absl::Milliseconds(200);
    options.dtype = torch::kFloat32;
    WeightSyncOptions sync{torch::kFloat32, false, false};
    sync.shm = Shm::kRequired;
    auto watcher = std::make_unique<PolicyWatcher>(services::MakeChannel(address), options, sync);
    watcher->Start();
    return watcher;
  }

  int starts_ = 0;
};

// Samplers hold whichever version is current while the learner (another
// process) publishes new ones through shared memory: every model a sampler
// holds is always exactly one published version, before and after it used
// it (the inactive copy is never one a sampler holds; a version is
// published only after its last byte is copied).
TEST_F(ShmProcessTest, AVersionSwappedWhileTheWorkerSamplesIsAlwaysWhole) {
  std::string address;
  std::unique_ptr<Child> learner = StartLearner(&address);
  constexpr int kVersions = 12;
  std::set<uint64_t> published;
  for (int v = 0; v < kVersions; ++v) published.insert(Checksum(VersionWeights(v)));
  PolicyWatcherOptions options{"sampler"};
  // Copying takes a while, so samplers overlap it.
  options.shm_mid_copy_hook = [](int64_t) { absl::SleepFor(absl::Milliseconds(20)); };
  auto watcher = Watcher(address, options);
  Publish(*learner, 0);
  ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());

  std::atomic<bool> done{false};
  std::atomic<int> checked{0}, torn{0};
  std::vector<std::thread> samplers;
  for (int s = 0; s < 2; ++s) {
    samplers.emplace_back([&] {
      while (!done) {
        const Policy policy = watcher->Current();
        const uint64_t before = ModelChecksum(*policy.model);
        absl::SleepFor(absl::Milliseconds(3));  // "sampling"
        const uint64_t after = ModelChecksum(*policy.model);
        if (before != after || published.count(before) == 0) ++torn;
        ++checked;
      }
    });
  }
  for (int v = 1; v < kVersions; ++v) {
    Publish(*learner, v);
    absl::SleepFor(absl::Milliseconds(15));
  }
  ASSERT_TRUE(watcher->WaitForVersion(kVersions - 1, absl::Now() + kWait).ok());
  done = true;
  for (std::thread& sampler : samplers) sampler.join();
  EXPECT_EQ(torn.load(), 0) << "of " << checked.load() << " sampled models";
  EXPECT_GT(checked.load(), 20);
  EXPECT_GE(watcher->shm_versions(), 2);
  EXPECT_EQ(ModelChecksum(*watcher->Current().model), Checksum(VersionWeights(kVersions - 1)));
  watcher->Stop();
  const int pid = learner->pid();
  EXPECT_LE(ShmSegmentsOf(pid).size(), 2u);
  EXPECT_EQ(learner->Finish(), 0);
  EXPECT_TRUE(ShmSegmentsOf(pid).empty());
}

// A worker SIGKILLed half-way through copying a version loses nothing the
// learner has and leaks nothing: the learner still unlinks that segment two
// versions later (the dead worker's open file did not hold it), and a new
// worker gets the latest version whole.
TEST_F(ShmProcessTest, AWorkerKilledMidCopyLeaksNothing) {
  std::string address;
  std::unique_ptr<Child> learner = StartLearner(&address);
  Publish(*learner, 0);
  Child worker({KAPPA_SHM_SYNC_FIXTURE, "worker", address, "block"});
  ASSERT_EQ(worker.ReadLine("mid-copy"), "mid-copy 0");
  const std::vector<std::string> during = ShmSegmentsOf(learner->pid());
  ASSERT_EQ(during.size(), 1u);
  // Another worker moves the learner on two versions while the first hangs.
  auto other = Watcher(address);
  for (int v = 1; v <= 2; ++v) {
    Publish(*learner, v);
    ASSERT_TRUE(other->WaitForVersion(v, absl::Now() + kWait).ok());
  }
  other->Stop();
  EXPECT_NE(access(("/dev/shm/" + during[0]).c_str(), F_OK), 0)
      << "version 0's segment outlived two newer versions";
  const int worker_pid = worker.pid();
  worker.Kill();
  EXPECT_TRUE(ShmSegmentsOf(worker_pid).empty());
  EXPECT_EQ(ShmSegmentsOf(learner->pid()).size(), 2u);  // versions 1 and 2

  Child restarted({KAPPA_SHM_SYNC_FIXTURE, "worker", address});
  EXPECT_EQ(restarted.ReadLine("loaded"), absl::StrCat("loaded 2 ", Checksum(VersionWeights(2))));
  restarted.Kill();
  const int pid = learner->pid();
  EXPECT_EQ(learner->Finish(), 0);
  EXPECT_TRUE(ShmSegmentsOf(pid).empty());
}

// A learner SIGKILLed after linking its segments leaks them only until the
// next learner starts: that one sweeps them, and the worker, reconnecting,
// takes the new learner's versions through shared memory.
TEST_F(ShmProcessTest, ARestartedLearnerSweepsTheDeadOnesSegments) {
  std::string address;
  std::unique_ptr<Child> first = StartLearner(&address);
  auto watcher = Watcher(address);
  Publish(*first, 0);
  ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());
  Publish(*first, 1);
  ASSERT_TRUE(watcher->WaitForVersion(1, absl::Now() + kWait).ok());
  const int dead = first->pid();
  ASSERT_EQ(ShmSegmentsOf(dead).size(), 2u);
  first->Kill();
  ASSERT_EQ(ShmSegmentsOf(dead).size(), 2u);  // a SIGKILL cannot clean up

  std::string second_address;
  std::unique_ptr<Child> second = StartLearner(&second_address);
  EXPECT_TRUE(ShmSegmentsOf(dead).empty()) << "the new learner left the dead one's segments";
  // The worker follows the learner to its new address (a restarted
  // learner at a new port: a fresh watcher, as a reconnecting worker).
  watcher->Stop();
  auto again = Watcher(second_address);
  Publish(*second, 2);
  ASSERT_TRUE(again->WaitForVersion(2, absl::Now() + kWait).ok());
  EXPECT_EQ(again->shm_versions(), 1);
  EXPECT_EQ(ModelChecksum(*again->Current().model), Checksum(VersionWeights(2)));
  again->Stop();
  const int pid = second->pid();
  EXPECT_EQ(second->Finish(), 0);
  EXPECT_TRUE(ShmSegmentsOf(pid).empty());
}

}  // namespace
}  // namespace kappa::rollout
