// Network faults, not dead processes: real learner, teacher, verifier and two
// rollout workers on loopback (tiny random models, as the other fault tests),
// with rollout-0's connections to the teacher, the verifier and the learner
// going through TcpFaultProxy (tcp_fault_proxy.h). The test process first
// moves itself into a private network namespace (unshare(CLONE_NEWNET), lo
// brought up), so every process it starts lives there and the nftables rules
// it adds touch nothing else on the machine.
//
//   LatencyLossAndPartitionCostTimeButNoData, one run:
//     (b) 5 % of the TCP packets to and from the learner's port dropped
//         (nftables, numgen random);
//     (a) 200 ms ± 50 ms each way on rollout-0's teacher and verifier links;
//     (c) rollout-0 partitioned from the learner for 20 s (latency still
//         on), then healed. Keepalive is set longer than the partition and
//         the lease timeout shorter, so the stream survives: its leases are
//         re-issued on expiry and the groups it sent into the partition
//         arrive late and are refused (unknown_lease), never trained.
//   HalfOpenWorkerConnectionIsNoticedByKeepalive, a second run:
//     (d) rollout-0's learner connection vanishes without FIN or RST; with a
//         2 s + 1 s keepalive and a 120 s lease timeout, only the learner's
//         keepalive can end the stream and re-issue its leases: the time it
//         takes is measured and bounded.
//
// Both: training goes on through every fault, no lease is trained twice,
// the learner's resident memory stays bounded, and it exits cleanly when
// stopped. The step count is open-ended (the tiny model's step rate varies
// several-fold with machine load, so a fixed count would end before a 20 s
// partition on a fast machine); each run ends with SIGTERM after recovery.
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/process_supervisor.h"
#include "tests/integration/fault_services.h"
#include "tests/integration/run_files.h"
#include "tests/integration/tcp_fault_proxy.h"
#include "tests/services/http_get.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kappa::testing::kAnyLoopbackPort;
using kappa::testing::ReadAll;
using kappa::testing::TcpFaultProxy;
using kappa::testing::TcpFaultProxyCounters;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// `command` through sh, stdout and stderr together; *status: its exit code.
std::string RunCommand(const std::string& command, int* status) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return "popen failed: " + std::string(strerror(errno));
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int raw = pclose(pipe);
  *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return output;
}

// This process in a network namespace of its own, once: the calling thread
// (the main one, before any other thread exists) moves, and every thread and
// child process started afterwards is created inside it.
struct PrivateNetwork {
  bool entered = false;
  std::string error;      // why not entered
  std::string nft_error;  // why nftables cannot be used in it
};

const PrivateNetwork& EnterPrivateNetwork() {
  static const PrivateNetwork network = [] {
    PrivateNetwork n;
    if (geteuid() != 0) {
      n.error = "not running as root (euid " + std::to_string(geteuid()) +
                "): unshare(CLONE_NEWNET) and nftables rules need CAP_SYS_ADMIN and "
                "CAP_NET_ADMIN";
      return n;
    }
    if (::unshare(CLONE_NEWNET) != 0) {
      n.error = "unshare(CLONE_NEWNET): " + std::string(strerror(errno));
      return n;
    }
    // ip link set lo up, without needing iproute2.
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq request{};
    std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
    if (fd < 0 || ::ioctl(fd, SIOCGIFFLAGS, &request) != 0 ||
        (request.ifr_flags |= IFF_UP, ::ioctl(fd, SIOCSIFFLAGS, &request) != 0)) {
      n.error = "bringing up lo in the new network namespace: " + std::string(strerror(errno));
    } else {
      n.entered = true;
    }
    if (fd >= 0) ::close(fd);
    int status = 0;
    const std::string out =
        RunCommand("nft add table inet kappa_probe && nft delete table inet kappa_probe", &status);
    if (status != 0)
      n.nft_error = "nft cannot add a table here (exit " + std::to_string(status) + "): " + out;
    return n;
  }();
  return network;
}

// nftables rules dropping `percent` % of the TCP packets to and from `port`
// (in this namespace), with counters; removed again by the destructor.
class PacketLoss {
 public:
  PacketLoss(int port, int percent) {
    const fs::path rules = fs::temp_directory_path() / ("kappa-loss-" + std::to_string(getpid()));
    // Loopback packets pass the output hook once each: count every packet
    // of the port, then drop some.
    std::string chain;
    for (const char* side : {"sport", "dport"}) {
      chain += "    tcp " + std::string(side) + " " + std::to_string(port) + " counter\n";
    }
    for (const char* side : {"sport", "dport"}) {
      chain += "    tcp " + std::string(side) + " " + std::to_string(port) +
               " numgen random mod 100 < " + std::to_string(percent) + " counter drop\n";
    }
    std::ofstream(rules) << "table inet kappa_loss {\n  chain out {\n"
                         << "    type filter hook output priority 0; policy accept;\n"
                         << chain << "  }\n}\n";
    int status = 0;
    error_ = RunCommand("nft -f " + rules.string(), &status);
    installed_ = status == 0;
    if (installed_) error_.clear();
    fs::remove(rules);
  }
  ~PacketLoss() {
    int status = 0;
    if (installed_) RunCommand("nft delete table inet kappa_loss", &status);
  }
  bool installed() const { return installed_; }
  const std::string& error() const { return error_; }

  struct Counts {
    int64_t packets = 0;  // seen on the port
    int64_t dropped = 0;
  };
  Counts counts() const {
    int status = 0;
    std::istringstream listing(RunCommand("nft list table inet kappa_loss", &status));
    Counts counts;
    std::string line;
    while (std::getline(listing, line)) {
      const size_t at = line.find("counter packets ");
      if (at == std::string::npos) continue;
      const int64_t packets = std::stoll(line.substr(at + 16));
      (line.find(" drop") != std::string::npos ? counts.dropped : counts.packets) += packets;
    }
    return counts;
  }

 private:
  bool installed_ = false;
  std::string error_;
};

// The value of one sample (`series` with its labels, as exposed) on a
// /metrics page; 0 when absent (a counter never incremented).
double Metric(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return 0;
}

double Scrape(const std::string& address, const std::string& series) {
  return Metric(kappa::testing::HttpGet(address, "/metrics").body, series);
}

// Resident set size of `pid` in MiB (VmRSS), 0 when it is gone.
double ResidentMiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

int PortOf(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// The end of a log, for failure messages.
std::string Tail(const std::string& text, size_t bytes = 4000) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

size_t CountOccurrences(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

// Learner, teacher and verifier, and rollout-0 (through the three proxies)
// and rollout-1 (direct), all with the same `overrides`.
class Cluster {
 public:
  static constexpr int kWorkers = 2;

  Cluster(const std::string& name, std::vector<std::string> overrides)
      : root_(fs::temp_directory_path() /
              ("kappa-fault-network-" + name + "-" + std::to_string(getpid()))),
        overrides_(std::move(overrides)) {
    fs::remove_all(root_);
    config_ = kappa::testing::WriteStandaloneRun(
        root_,
        "{steps: 1000000, groups_per_step: 3, group_size: 4, eval_every: 0,"
        " eval_examples: 4, checkpoint_every: 0}");
  }
  ~Cluster() {
    supervisor_.StopAll(std::chrono::seconds(5));
    if (!keep_) fs::remove_all(root_);
  }

  // Starts everything; false (with a message on stderr) when something did
  // not come up.
  bool Start() {
    // Each binds port 0 and reports what it bound (SpawnReady).
    const std::optional<kappa::services::ReadyInfo> learner_ready =
        SpawnReady("learner", KAPPA_LEARNER,
                   {"--address", kAnyLoopbackPort, "--metrics-address", kAnyLoopbackPort,
                    "--run-dir", run_dir().string()},
                   &learner_pid_);
    const std::optional<kappa::services::ReadyInfo> teacher_ready =
        SpawnReady("teacher", KAPPA_TEACHER, {"--address", kAnyLoopbackPort});
    const std::optional<kappa::services::ReadyInfo> verifier_ready =
        SpawnReady("verifier", KAPPA_VERIFIER, {"--address", kAnyLoopbackPort});
    if (!learner_ready || !teacher_ready || !verifier_ready) {
      std::cerr << Tail(ReadAll(log("learner")));
      return false;
    }
    learner = learner_ready->address;
    learner_metrics = learner_ready->metrics_address;
    teacher = teacher_ready->address;
    verifier = verifier_ready->address;
    teacher_link = std::make_unique<TcpFaultProxy>(teacher);
    verifier_link = std::make_unique<TcpFaultProxy>(verifier);
    learner_link = std::make_unique<TcpFaultProxy>(learner);
    for (int i = 0; i < kWorkers; ++i) {
      const bool proxied = i == 0;
      const std::optional<kappa::services::ReadyInfo> ready =
          SpawnReady(worker(i), KAPPA_ROLLOUT_WORKER,
                     {"--worker-id", worker(i), "--metrics-address", kAnyLoopbackPort, "--learner",
                      proxied ? learner_link->address() : learner, "--teacher",
                      proxied ? teacher_link->address() : teacher, "--verifier",
                      proxied ? verifier_link->address() : verifier});
      if (!ready) return false;
      worker_metrics.push_back(ready->metrics_address);
    }
    // Both workers deliver, and training is under way.
    return WaitUntil(std::chrono::seconds(90), [&] {
      return WorkerMetric(0, "kappa_worker_groups_total") > 0 &&
             WorkerMetric(1, "kappa_worker_groups_total") > 0 && Step() >= 3;
    });
  }

  // Polls `done` every 50 ms (sampling the learner's memory) until it holds
  // or `timeout` passes; its last value.
  bool WaitUntil(Clock::duration timeout, const std::function<bool()>& done) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      SampleMemory();
      if (done()) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  void Hold(Clock::duration duration) {
    WaitUntil(duration, [] { return false; });
  }
  void SampleMemory() { max_rss_mib = std::max(max_rss_mib, ResidentMiB(learner_pid_)); }

  double LearnerMetric(const std::string& series) const { return Scrape(learner_metrics, series); }
  double WorkerMetric(int i, const std::string& series) const {
    return Scrape(worker_metrics[i], series);
  }
  int Step() const { return static_cast<int>(LearnerMetric("kappa_learner_step")); }
  double Reissued() const { return LearnerMetric("kappa_learner_leases_reissued_total"); }
  double DroppedUnknown() const {
    return LearnerMetric("kappa_learner_groups_dropped_total{reason=\"unknown_lease\"}");
  }
  double DroppedStale() const {
    return LearnerMetric("kappa_learner_groups_dropped_total{reason=\"stale\"}");
  }
  double LearnerRss() const { return ResidentMiB(learner_pid_); }

  // SIGTERM to the learner; its exit, or nullopt if it was still running
  // after 15 s (then it is killed).
  kappa::testing::TimedExit StopLearner() {
    return kappa::testing::ExitAfterSigterm(supervisor_, learner_pid_, std::chrono::seconds(15));
  }

  static std::string worker(int i) { return "rollout-" + std::to_string(i); }
  fs::path log(const std::string& process) const { return root_ / (process + ".log"); }
  fs::path run_dir() const { return root_ / "run"; }
  fs::path metrics_jsonl() const { return run_dir() / "metrics.jsonl"; }
  void Keep() { keep_ = true; }  // leave the files for a failed test

  // Where each process listens, as it reported once bound (Start()).
  std::string teacher, verifier, learner, learner_metrics;
  std::vector<std::string> worker_metrics;
  // rollout-0's links.
  std::unique_ptr<TcpFaultProxy> teacher_link, verifier_link, learner_link;
  double max_rss_mib = 0;

 private:
  // `binary` with the overrides, once it has written its ready file: the
  // addresses it bound (`*pid` set), or nullopt with a message on stderr.
  std::optional<kappa::services::ReadyInfo> SpawnReady(const std::string& name,
                                                       const std::string& binary,
                                                       std::vector<std::string> args,
                                                       pid_t* pid = nullptr) {
    args.insert(args.end(), overrides_.begin(), overrides_.end());
    absl::StatusOr<kappa::testing::ReadyService> started = kappa::testing::SpawnReady(
        supervisor_, kappa::testing::ServiceSpec(name, binary, config_, std::move(args), log(name)),
        root_ / (name + ".ready.json"));
    if (!started.ok()) {
      std::cerr << started.status() << "\n";
      return std::nullopt;
    }
    if (pid != nullptr) *pid = started->pid;
    return started->ready;
  }

  const fs::path root_;
  const std::vector<std::string> overrides_;
  fs::path config_;
  kappa::cli::ProcessSupervisor supervisor_;
  pid_t learner_pid_ = 0;
  bool keep_ = false;
};

// A phase: steps, seconds, rollout-0's groups and the groups dropped as
// stale from its start to End().
struct Phase {
  Phase(const char* name, const Cluster& cluster)
      : name(name),
        start(Clock::now()),
        start_step(cluster.Step()),
        start_groups(cluster.WorkerMetric(0, "kappa_worker_groups_total")),
        start_stale(cluster.DroppedStale()) {}
  void End(const Cluster& cluster) {
    seconds = SecondsSince(start);
    steps = cluster.Step() - start_step;
    worker0_groups = cluster.WorkerMetric(0, "kappa_worker_groups_total") - start_groups;
    stale = cluster.DroppedStale() - start_stale;
  }
  double rate() const { return seconds > 0 ? steps / seconds : 0; }
  std::string Describe() const {
    std::ostringstream out;
    out << name << ": " << rate() << " steps/s (" << steps << " in " << seconds << " s), rollout-0 "
        << worker0_groups << " groups, " << stale << " stale drops";
    return out.str();
  }
  const char* name;
  Clock::time_point start;
  int start_step;
  double start_groups, start_stale;
  int steps = 0;
  double seconds = 0, worker0_groups = 0, stale = 0;
};

// What the learner's metrics.jsonl says at the end: every step trained on
// three distinct leases, none twice, and every accepted group accounted for.
void ExpectNothingLostOrTrainedTwice(const Cluster& cluster) {
  const kappa::testing::TrainedGroups trained =
      kappa::testing::ReadTrainedGroups(cluster.metrics_jsonl());
  EXPECT_TRUE(trained.repeated.empty()) << "leases trained twice: " << trained.repeated.size();
  EXPECT_GT(trained.steps, 0);
  EXPECT_EQ(trained.leases.size(), static_cast<size_t>(3 * trained.steps));
  nlohmann::json last;
  int expected_step = 0;
  for (const nlohmann::json& record : kappa::testing::StepRecords(cluster.metrics_jsonl())) {
    if (record.value("step", 0) == 0) continue;
    EXPECT_EQ(record.value("step", 0), ++expected_step) << "steps are not contiguous";
    last = record;
  }
  ASSERT_FALSE(last.is_null());
  const int64_t accepted = last["groups_accepted"], consumed = last["groups_consumed"],
                stale = last["groups_dropped_stale"], buffered = last["buffer_groups"];
  EXPECT_EQ(accepted, consumed + stale + buffered) << last.dump();
}

TEST(TcpFaultProxyTest, DelaysHoldsAndVanishes) {
  EnterPrivateNetwork();  // before any thread; loopback works either way
  // An echo server on loopback.
  const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  ASSERT_EQ(::bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(server, 8), 0);
  ASSERT_EQ(::getsockname(server, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  std::mutex accepted_mu;
  std::vector<int> accepted;
  std::thread echo([&] {
    while (true) {
      const int fd = ::accept(server, nullptr, nullptr);
      if (fd < 0) return;
      {
        std::lock_guard<std::mutex> lock(accepted_mu);
        accepted.push_back(fd);
      }
      std::thread([fd] {
        char buffer[4096];
        ssize_t n;
        while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) {
          if (::write(fd, buffer, static_cast<size_t>(n)) != n) break;
        }
        ::shutdown(fd, SHUT_WR);
      }).detach();
    }
  });
  auto proxy = std::make_unique<TcpFaultProxy>("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  auto connect = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(static_cast<uint16_t>(PortOf(proxy->address())));
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    timeval timeout{0, 100000};  // reads give up after 100 ms
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    return fd;
  };
  // Sends `text`, then reads until as many bytes came back or `limit`;
  // the seconds it took (-1: not all came back) and what came back.
  auto round_trip = [](int fd, const std::string& text, double limit, std::string* back) {
    const auto start = Clock::now();
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    back->clear();
    char buffer[4096];
    while (back->size() < text.size() && SecondsSince(start) < limit) {
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n == 0) break;
      if (n > 0) back->append(buffer, static_cast<size_t>(n));
    }
    return back->size() == text.size() ? SecondsSince(start) : -1;
  };
  std::string back;
  const int fd = connect();
  EXPECT_LT(round_trip(fd, "plain", 2, &back), 0.1);
  EXPECT_EQ(back, "plain");

  // 150 ± 50 ms each way: a round trip takes 200..400 ms, order kept.
  proxy->SetLatency(std::chrono::milliseconds(150), std::chrono::milliseconds(50));
  for (int i = 0; i < 5; ++i) {
    const std::string text = "delayed-" + std::to_string(i);
    const double seconds = round_trip(fd, text, 2, &back);
    EXPECT_GE(seconds, 0.195) << i;
    EXPECT_LT(seconds, 0.6) << i;
    EXPECT_EQ(back, text);
  }
  proxy->PassThrough();

  // A partition holds the bytes, and healing delivers them in order.
  proxy->Blackhole();
  EXPECT_LT(round_trip(fd, "held", 0.5, &back), 0);
  EXPECT_EQ(back, "");
  EXPECT_GE(proxy->counters().bytes_held, 4);
  proxy->Heal();
  char buffer[64];
  std::string healed;
  const auto heal_start = Clock::now();
  while (healed.size() < 4 && SecondsSince(heal_start) < 2) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) healed.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_EQ(healed, "held");

  // A vanished connection: nothing comes back, and neither end is closed,
  // even after the server closes its side.
  proxy->Vanish();
  EXPECT_LT(round_trip(fd, "gone", 0.5, &back), 0);
  EXPECT_EQ(proxy->counters().connections_vanished, 1);
  EXPECT_GE(proxy->counters().bytes_discarded, 4);
  {
    std::lock_guard<std::mutex> lock(accepted_mu);
    for (int server_side : accepted) ::shutdown(server_side, SHUT_RDWR);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  errno = 0;
  EXPECT_EQ(::read(fd, buffer, sizeof(buffer)), -1) << "the client saw the server's close";
  EXPECT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << strerror(errno);
  // A new connection after Heal() works again.
  proxy->PassThrough();
  const int fresh = connect();
  EXPECT_LT(round_trip(fresh, "again", 2, &back), 0.5);
  EXPECT_EQ(back, "again");
  EXPECT_EQ(proxy->counters().connections_accepted, 2);

  ::close(fd);
  ::close(fresh);
  proxy.reset();
  ::shutdown(server, SHUT_RDWR);
  ::close(server);
  echo.join();
}

TEST(FaultNetworkTest, LatencyLossAndPartitionCostTimeButNoData) {
  const PrivateNetwork& network = EnterPrivateNetwork();
  if (!network.entered) {
    GTEST_SKIP() << "packet loss needs a private network namespace: " << network.error;
  }
  if (!network.nft_error.empty()) GTEST_SKIP() << network.nft_error;
  const auto test_start = Clock::now();
  constexpr int kLeaseTimeoutMs = 4000;
  constexpr auto kPartition = std::chrono::seconds(20);
  // Keepalive outlasts the partition (a ping sent in it is answered within
  // 30 s), so the stream survives and only the lease timeout re-issues.
  Cluster cluster("partition",
                  {"learner.lease_timeout_ms=" + std::to_string(kLeaseTimeoutMs),
                   "security.keepalive_time_ms=20000", "security.keepalive_timeout_ms=30000"});
  ASSERT_TRUE(cluster.Start()) << Tail(ReadAll(cluster.log("learner")));
  const double rss_start = cluster.LearnerRss();
  Phase warm("warm", cluster);
  cluster.Hold(std::chrono::seconds(3));
  warm.End(cluster);

  // (b) 5 % packet loss on the learner's port, both directions.
  Phase lossy("5% loss", cluster);
  const double worker1_groups_before_loss = cluster.WorkerMetric(1, "kappa_worker_groups_total");
  PacketLoss::Counts loss_counts;
  {
    PacketLoss loss(PortOf(cluster.learner), 5);
    ASSERT_TRUE(loss.installed()) << loss.error();
    cluster.Hold(std::chrono::seconds(10));
    loss_counts = loss.counts();
  }
  lossy.End(cluster);
  EXPECT_GT(loss_counts.dropped, 0) << "nftables dropped nothing";
  EXPECT_NEAR(static_cast<double>(loss_counts.dropped) / std::max<int64_t>(1, loss_counts.packets),
              0.05, 0.02)
      << loss_counts.dropped << " of " << loss_counts.packets << " packets dropped";
  EXPECT_GT(lossy.steps, 0) << "no step under 5 % loss";
  EXPECT_GT(cluster.WorkerMetric(1, "kappa_worker_groups_total"), worker1_groups_before_loss);

  // (a) 200 ± 50 ms each way on rollout-0's teacher and verifier links.
  Phase slow("latency", cluster);
  const double worker0_groups_before_latency = cluster.WorkerMetric(0, "kappa_worker_groups_total");
  auto rpc_errors = [&] {
    return cluster.WorkerMetric(0, "kappa_worker_rpc_errors_total{peer=\"teacher\"}") +
           cluster.WorkerMetric(0, "kappa_worker_rpc_errors_total{peer=\"verifier\"}");
  };
  const double rpc_errors_before = rpc_errors();
  for (TcpFaultProxy* link : {cluster.teacher_link.get(), cluster.verifier_link.get()}) {
    link->SetLatency(std::chrono::milliseconds(200), std::chrono::milliseconds(50));
  }
  cluster.Hold(std::chrono::seconds(10));
  slow.End(cluster);
  const double worker0_groups_slow =
      cluster.WorkerMetric(0, "kappa_worker_groups_total") - worker0_groups_before_latency;
  EXPECT_GT(slow.steps, 0);
  EXPECT_GT(worker0_groups_slow, 0) << "rollout-0 sent nothing through the slow links";
  EXPECT_EQ(rpc_errors(), rpc_errors_before) << "a 400 ms round trip failed calls";

  // (c) rollout-0 cut off from the learner for 20 s (latency still on, so
  // it is mid-group when the partition starts), then healed.
  const double reissued_before = cluster.Reissued();
  const double unknown_before = cluster.DroppedUnknown();
  const double connections_before =
      cluster.WorkerMetric(0, "kappa_worker_learner_connections_total");
  const std::string learner_log_before = ReadAll(cluster.log("learner"));
  Phase cut("partition", cluster);
  cluster.learner_link->Blackhole();
  double first_reissue_s = -1;
  cluster.WaitUntil(kPartition, [&] {
    if (first_reissue_s < 0 && cluster.Reissued() > reissued_before) {
      first_reissue_s = SecondsSince(cut.start);
    }
    return false;
  });
  const double reissued_in_partition = cluster.Reissued() - reissued_before;
  const TcpFaultProxyCounters held = cluster.learner_link->counters();
  cluster.learner_link->Heal();
  cut.End(cluster);
  for (TcpFaultProxy* link : {cluster.teacher_link.get(), cluster.verifier_link.get()}) {
    link->PassThrough();
  }
  EXPECT_GT(cut.steps, 0) << "training stopped while one worker was partitioned";
  EXPECT_GT(reissued_in_partition, 0) << "rollout-0's leases were not re-issued";
  // Re-issued by expiry, not at once (a disconnect would re-issue at once,
  // and the stream is checked below to have survived).
  EXPECT_GE(first_reissue_s, 1.0) << "re-issued before any lease could expire";

  // After the heal: the late groups are refused and counted; rollout-0
  // works again on the same stream.
  Phase healed("healed", cluster);
  const double worker0_groups_at_heal = cluster.WorkerMetric(0, "kappa_worker_groups_total");
  const bool refused = cluster.WaitUntil(std::chrono::seconds(15),
                                         [&] { return cluster.DroppedUnknown() > unknown_before; });
  EXPECT_TRUE(refused) << "no late group of rollout-0 refused\n"
                       << Tail(ReadAll(cluster.log("rollout-0")));
  const bool rejoined = cluster.WaitUntil(std::chrono::seconds(30), [&] {
    return cluster.WorkerMetric(0, "kappa_worker_groups_total") >= worker0_groups_at_heal + 3 &&
           cluster.Step() >= healed.start_step + 10;
  });
  EXPECT_TRUE(rejoined) << "rollout-0 did not work again after the heal\n"
                        << Tail(ReadAll(cluster.log("rollout-0")));
  cluster.Hold(std::chrono::seconds(2));
  healed.End(cluster);
  const double late_refused = cluster.DroppedUnknown() - unknown_before;
  EXPECT_EQ(cluster.WorkerMetric(0, "kappa_worker_learner_connections_total"), connections_before)
      << "the stream did not survive the partition";
  const std::string learner_log = ReadAll(cluster.log("learner")).substr(learner_log_before.size());
  EXPECT_NE(learner_log.find("dropped group for lease"), std::string::npos) << Tail(learner_log);

  const double stale = cluster.DroppedStale();
  const kappa::testing::TimedExit exit = cluster.StopLearner();
  EXPECT_GE(exit.seconds, 0) << "learner still running 15 s after SIGTERM";
  EXPECT_TRUE(exit.seconds < 0 || exit.status.success()) << exit.status.ToString();
  ExpectNothingLostOrTrainedTwice(cluster);
  EXPECT_LT(cluster.max_rss_mib - rss_start, 128.0) << "learner memory grew";
  if (HasFailure()) cluster.Keep();

  for (const Phase* phase : {&warm, &lossy, &slow, &cut, &healed}) {
    std::cout << phase->Describe() << "\n";
  }
  std::cout << "loss: nftables dropped " << loss_counts.dropped << " of " << loss_counts.packets
            << " packets on the learner port ("
            << 100.0 * loss_counts.dropped / std::max<int64_t>(1, loss_counts.packets) << " %)\n"
            << "latency: rollout-0 sent " << worker0_groups_slow << " groups in " << slow.seconds
            << " s through 200±50 ms links (" << warm.worker0_groups << " in " << warm.seconds
            << " s before); stale drops over the run " << stale << "\n"
            << "partition " << std::chrono::seconds(kPartition).count()
            << " s: " << reissued_in_partition << " leases re-issued (first after "
            << first_reissue_s << " s, lease_timeout " << kLeaseTimeoutMs / 1000.0 << " s), "
            << held.bytes_held << " bytes held by the link at the heal; " << late_refused
            << " late groups refused (unknown_lease) after it\n"
            << "learner RSS " << rss_start << " MiB at start, max " << cluster.max_rss_mib
            << " MiB; whole test " << SecondsSince(test_start) << " s\n";
}

TEST(FaultNetworkTest, HalfOpenWorkerConnectionIsNoticedByKeepalive) {
  EnterPrivateNetwork();  // isolation when it can; plain loopback otherwise
  const auto test_start = Clock::now();
  constexpr int kKeepaliveMs = 2000, kKeepaliveTimeoutMs = 1000;
  constexpr int kLeaseTimeoutMs = 120000;  // far longer: only keepalive can end the stream
  // gRPC closes the transport within time + timeout of the last byte read;
  // the Rollout handler then ends within its 500 ms wake-ups (measured
  // 0.5-1.0 s later on the 2-core machine).
  constexpr double kSlackSeconds = 2.5;
  constexpr double kBound = (kKeepaliveMs + kKeepaliveTimeoutMs) / 1000.0 + kSlackSeconds;
  Cluster cluster("halfopen",
                  {"learner.lease_timeout_ms=" + std::to_string(kLeaseTimeoutMs),
                   "security.keepalive_time_ms=" + std::to_string(kKeepaliveMs),
                   "security.keepalive_timeout_ms=" + std::to_string(kKeepaliveTimeoutMs)});
  ASSERT_TRUE(cluster.Start()) << Tail(ReadAll(cluster.log("learner")));
  const double rss_start = cluster.LearnerRss();
  cluster.Hold(std::chrono::seconds(2));

  const std::regex disconnect("worker rollout-0#[0-9]+ disconnected after ");
  const std::string learner_log_before = ReadAll(cluster.log("learner"));
  const size_t worker_ends_before =
      CountOccurrences(ReadAll(cluster.log("rollout-0")), "Rollout stream to the learner ended");
  const double reissued_before = cluster.Reissued();
  const double connections_before =
      cluster.WorkerMetric(0, "kappa_worker_learner_connections_total");
  Phase gone("vanished", cluster);
  cluster.learner_link->Vanish();
  double learner_noticed_s = -1, reissued_s = -1, worker_noticed_s = -1;
  cluster.WaitUntil(std::chrono::milliseconds(static_cast<int>(1000 * (kBound + 8))), [&] {
    const std::string log = ReadAll(cluster.log("learner")).substr(learner_log_before.size());
    if (learner_noticed_s < 0 && std::regex_search(log, disconnect)) {
      learner_noticed_s = SecondsSince(gone.start);
    }
    if (reissued_s < 0 && cluster.Reissued() > reissued_before)
      reissued_s = SecondsSince(gone.start);
    if (worker_noticed_s < 0 &&
        CountOccurrences(ReadAll(cluster.log("rollout-0")), "Rollout stream to the learner ended") >
            worker_ends_before) {
      worker_noticed_s = SecondsSince(gone.start);
    }
    return learner_noticed_s >= 0 && reissued_s >= 0 && worker_noticed_s >= 0;
  });
  const double reissued = cluster.Reissued() - reissued_before;
  gone.End(cluster);
  EXPECT_GE(learner_noticed_s, 0) << "the learner never noticed the half-open stream";
  EXPECT_LE(learner_noticed_s, kBound) << "noticed later than keepalive time + timeout + slack";
  if (learner_noticed_s >= 0) {
    EXPECT_GT(learner_noticed_s, 0.5) << "noticed at once: the connection was not half-open";
  }
  EXPECT_GT(reissued, 0) << "the vanished worker's leases were not re-issued";
  EXPECT_GT(gone.steps, 0) << "training stopped while rollout-0 was gone";

  // The network comes back: rollout-0 reconnects on a new connection.
  Phase back("reconnected", cluster);
  cluster.learner_link->PassThrough();
  const double worker0_groups = cluster.WorkerMetric(0, "kappa_worker_groups_total");
  double rejoined_s = -1;
  const bool rejoined = cluster.WaitUntil(std::chrono::seconds(30), [&] {
    if (rejoined_s < 0 &&
        cluster.WorkerMetric(0, "kappa_worker_learner_connections_total") > connections_before) {
      rejoined_s = SecondsSince(back.start);
    }
    return rejoined_s >= 0 &&
           cluster.WorkerMetric(0, "kappa_worker_groups_total") >= worker0_groups + 3;
  });
  EXPECT_TRUE(rejoined) << Tail(ReadAll(cluster.log("rollout-0")));
  cluster.Hold(std::chrono::seconds(2));
  back.End(cluster);
  const TcpFaultProxyCounters link_counters = cluster.learner_link->counters();

  const kappa::testing::TimedExit exit = cluster.StopLearner();
  EXPECT_GE(exit.seconds, 0) << "learner still running 15 s after SIGTERM";
  EXPECT_TRUE(exit.seconds < 0 || exit.status.success()) << exit.status.ToString();
  ExpectNothingLostOrTrainedTwice(cluster);
  EXPECT_LT(cluster.max_rss_mib - rss_start, 128.0) << "learner memory grew";
  if (HasFailure()) cluster.Keep();

  std::cout << "half-open learner connection (keepalive " << kKeepaliveMs / 1000.0 << " s + "
            << kKeepaliveTimeoutMs / 1000.0 << " s, lease_timeout " << kLeaseTimeoutMs / 1000
            << " s): learner noticed after " << learner_noticed_s << " s (bound " << kBound
            << " s), re-issued " << reissued << " leases after " << reissued_s
            << " s; rollout-0 noticed after " << worker_noticed_s << " s, reconnected "
            << rejoined_s << " s after the heal; link: " << link_counters.connections_vanished
            << " connections vanished, " << link_counters.bytes_discarded << " bytes discarded\n"
            << gone.Describe() << "\n"
            << back.Describe() << "\nlearner RSS " << rss_start << " MiB at start, max "
            << cluster.max_rss_mib << " MiB; whole test " << SecondsSince(test_start) << " s\n";
}

}  // namespace
