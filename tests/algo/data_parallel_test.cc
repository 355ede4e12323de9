// The data-parallel learner step on real c10d Gloo process groups (two
// ranks, one thread each): after N steps the ranks' parameters are bitwise
// identical, and equal to one process stepping on the whole batch, also when
// the ranks hold unequal shares (so the ranks' gradients are weighted by
// their token counts, not averaged as a mean of means).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dist/collectives.h"
#include "learner/algo/hybrid_step.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::RandomGroups;
using testing::TinyModel;

constexpr int kSteps = 3;

struct RunResult {
  std::vector<torch::Tensor> parameters;
  std::vector<double> kappas;
  std::vector<double> distill_losses;
};

HybridStepConfig Config(int64_t kappa_every) {
  HybridStepConfig config;
  config.loss.lambda = 0.5;
  config.monitor.kappa_every = kappa_every;
  return config;
}

// kSteps steps of `model`; at step s the batch is `groups[s]` (this rank's share).
RunResult Train(model::Decoder model, const HybridStepConfig& config,
                dist::Collectives* collectives,
                const std::vector<std::vector<ScoredGroup>>& groups) {
  auto optimizer = std::make_unique<PolicyOptimizer>(model, 1e-3, 0.01, /*max_grad_norm=*/1.0);
  optimizer->set_collectives(collectives);
  HybridStep step(model, std::move(optimizer), config);
  RunResult result;
  for (int s = 0; s < kSteps; ++s) {
    const HybridStepReport report = step.Run(BuildTrainBatch(groups[s], true, 0));
    result.kappas.push_back(report.stats.kappa().value_or(-1));
    result.distill_losses.push_back(report.stats.distill_loss);
  }
  for (const torch::Tensor& p : model->parameters()) result.parameters.push_back(p.detach().clone());
  return result;
}

// Rank r of 2 trains on groups [split[r], split[r+1]) of each step's 6 groups.
void ExpectDataParallelEqualsOneProcess(
    const HybridStepConfig& config, std::vector<size_t> split,
    const std::function<std::unique_ptr<dist::Collectives>(int)>& join) {
  // Models and data come from torch's global generator: made here, before
  // the rank threads start, not raced for inside them.
  std::vector<std::vector<ScoredGroup>> whole(kSteps);
  std::vector<std::vector<std::vector<ScoredGroup>>> shares(2, std::vector<std::vector<ScoredGroup>>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    whole[s] = RandomGroups(6, 4, true, 100 + s);
    for (int r = 0; r < 2; ++r) {
      shares[r][s] = {whole[s].begin() + split[r], whole[s].begin() + split[r + 1]};
    }
  }
  const RunResult single = Train(TinyModel(11), config, nullptr, whole);
  // Rank 1 starts from other weights: the broadcast must fix that.
  std::vector<model::Decoder> models = {TinyModel(11), TinyModel(12)};

  std::vector<RunResult> ranks(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<dist::Collectives> collectives = join(r);
      ranks[r] = Train(models[r], config, collectives.get(), shares[r]);
    });
  }
  for (std::thread& t : threads) t.join();

  ASSERT_EQ(ranks[0].parameters.size(), single.parameters.size());
  for (size_t i = 0; i < single.parameters.size(); ++i) {
    EXPECT_TRUE(torch::equal(ranks[0].parameters[i], ranks[1].parameters[i]))
        << "parameter " << i << " differs between the ranks";
    EXPECT_TRUE(torch::allclose(ranks[0].parameters[i], single.parameters[i], 1e-4, 1e-6))
        << "parameter " << i << ": max |diff| "
        << (ranks[0].parameters[i] - single.parameters[i]).abs().max().item<double>();
  }
  for (int s = 0; s < kSteps; ++s) {
    // κ and the losses are the whole batch's, the same on every rank.
    EXPECT_EQ(ranks[0].kappas[s], ranks[1].kappas[s]) << "step " << s;
    EXPECT_NEAR(ranks[0].kappas[s], single.kappas[s], 1e-4 * std::fabs(single.kappas[s]) + 1e-9)
        << "step " << s;
    EXPECT_NEAR(ranks[0].distill_losses[s], single.distill_losses[s], 1e-5) << "step " << s;
  }
}

TEST(DataParallelTest, TwoGlooRanksEqualOneProcessOnTheWholeBatch) {
  dist::InProcessRendezvous rendezvous(2);
  ExpectDataParallelEqualsOneProcess(Config(/*kappa_every=*/1), {0, 3, 6},
                                     [&](int rank) { return rendezvous.Join(rank); });
}

TEST(DataParallelTest, UnequalSharesAreWeightedByTheirTokens) {
  // One group against five, in both step paths (separate backward passes
  // with κ, and the single backward of the weighted sum).
  for (int64_t kappa_every : {1, 0}) {
    SCOPED_TRACE("kappa_every " + std::to_string(kappa_every));
    dist::InProcessRendezvous rendezvous(2);
    ExpectDataParallelEqualsOneProcess(Config(kappa_every), {0, 1, 6},
                                       [&](int rank) { return rendezvous.Join(rank); });
  }
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(DataParallelTest, RanksMeetThroughATcpStore) {
  const std::string store = "tcp://127.0.0.1:" + std::to_string(FreePort());
  ExpectDataParallelEqualsOneProcess(Config(1), {0, 2, 6}, [&](int rank) {
    dist::CollectivesOptions options;
    options.store = store;
    options.rank = rank;
    options.world_size = 2;
    options.timeout = std::chrono::seconds(60);
    return dist::ConnectCollectives(options);
  });
}

// The address of a /proc/net/tcp or tcp6 "local_address" (hex, as the
// kernel stores it): "127.0.0.1", "0.0.0.0", "::", "::1", or the hex of
// another IPv6 address (a v4-mapped one printed as its IPv4 address).
std::string ProcAddress(const std::string& hex) {
  auto ipv4 = [](const std::string& word) {
    in_addr in{};
    in.s_addr = static_cast<uint32_t>(std::stoul(word, nullptr, 16));
    return std::string(inet_ntoa(in));
  };
  if (hex.size() == 8) return ipv4(hex);
  if (hex == std::string(32, '0')) return "::";
  if (hex == "00000000000000000000000001000000") return "::1";
  if (hex.substr(0, 24) == "0000000000000000FFFF0000") return ipv4(hex.substr(24));
  return hex;
}

// A TCP socket of this process: its local address and port, and whether
// it listens (else: connected).
struct ProcSocket {
  std::string address;
  int port = 0;
  bool listening = false;
};

// This process's TCP sockets, from /proc/net/tcp and tcp6 (listening:
// state 0A; connected: 01) for the inodes of its descriptors.
std::vector<ProcSocket> ProcessSockets() {
  std::set<std::string> inodes;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(fd.path(), error).string();
    if (!error && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<ProcSocket> sockets;
  for (const char* path : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream table(path);
    std::string line;
    std::getline(table, line);  // the header
    while (std::getline(table, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if ((state != "0A" && state != "01") || inodes.count(inode) == 0) continue;
      const size_t colon = local.find(':');
      sockets.push_back({ProcAddress(local.substr(0, colon)),
                         std::stoi(local.substr(colon + 1), nullptr, 16), state == "0A"});
    }
  }
  return sockets;
}

TEST(DataParallelTest, GlooBindsLoopbackForALoopbackStoreOnly) {
  EXPECT_EQ(dist::GlooBindHost("tcp://127.0.0.1:29500"), "127.0.0.1");
  EXPECT_EQ(dist::GlooBindHost("tcp://localhost:29500"), "127.0.0.1");
  EXPECT_EQ(dist::GlooBindHost("tcp://127.1.2.3:0"), "127.0.0.1");
  // Another host's store: this rank's own address, Gloo's default.
  EXPECT_EQ(dist::GlooBindHost("tcp://learner-0.learner-peers:29500"), "");
  EXPECT_EQ(dist::GlooBindHost("tcp://10.0.0.7:29500"), "");
  EXPECT_EQ(dist::GlooBindHost("file:///tmp/store"), "");
}

// What a loopback group has open once it met: the TCPStore listens on
// every interface (libtorch 1.13 has no bind address; docs/security.md),
// and every connection, Gloo's pairs and the store's, is on loopback.
TEST(DataParallelTest, ALoopbackGroupConnectsOnLoopbackOnly) {
  const int port = FreePort();
  std::vector<ProcSocket> sockets;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      dist::CollectivesOptions options;
      options.store = "tcp://127.0.0.1:" + std::to_string(port);
      options.rank = rank;
      options.world_size = 2;
      options.timeout = std::chrono::seconds(60);
      std::unique_ptr<dist::Collectives> group = dist::ConnectCollectives(options);
      torch::Tensor sync = torch::zeros({1});
      group->SumInPlace({sync});  // both ranks' Gloo pairs are up
      if (rank == 0) sockets = ProcessSockets();
      group->SumInPlace({sync});  // rank 1 stays until rank 0 has looked
    });
  }
  for (std::thread& t : threads) t.join();
  int listening = 0, connected = 0;
  for (const ProcSocket& socket : sockets) {
    if (socket.listening) {
      EXPECT_EQ(socket.port, port) << "a listener other than the store's: " << socket.address;
      EXPECT_EQ(socket.address, "::") << "the store now binds one address: update docs/security.md";
      ++listening;
    } else {
      EXPECT_EQ(socket.address, "127.0.0.1") << "a connection from port " << socket.port;
      ++connected;
    }
  }
  EXPECT_EQ(listening, 1);
  EXPECT_GE(connected, 4) << "Gloo's pairs and the store's connections, both ends";
}

TEST(DataParallelTest, BadStoreAddressesAreRefused) {
  dist::CollectivesOptions options;
  options.world_size = 2;
  for (const char* store : {"127.0.0.1:29500", "tcp://127.0.0.1", "tcp://host:http", "nfs:///x"}) {
    options.store = store;
    EXPECT_THROW(dist::ConnectCollectives(options), std::invalid_argument) << store;
  }
  options.store = "tcp://127.0.0.1:29500";
  options.rank = 2;
  EXPECT_THROW(dist::ConnectCollectives(options), std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner
