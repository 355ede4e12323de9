#include "dist/collectives.h"

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <stdexcept>
#include <string>

#include "base/loopback.h"

namespace kappa::dist {
namespace {

// Over any c10d process group class: ProcessGroupGloo and ProcessGroupNCCL
// have the same allreduce/broadcast signatures in libtorch 1.13 (where they
// are ProcessGroups) and 2.x (where they are Backends).
template <typename Group>
class C10dCollectives final : public Collectives {
 public:
  C10dCollectives(c10::intrusive_ptr<Group> group, int rank, int size)
      : group_(std::move(group)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void SumInPlace(const std::vector<torch::Tensor>& tensors) override {
    AllReduceEach(tensors, ::c10d::ReduceOp::SUM);
  }

  void MaxInPlace(const std::vector<torch::Tensor>& tensors) override {
    AllReduceEach(tensors, ::c10d::ReduceOp::MAX);
  }

  void Broadcast(const std::vector<torch::Tensor>& tensors, int root) override {
    if (size_ == 1) return;
    for (const torch::Tensor& tensor : tensors) {
      std::vector<torch::Tensor> one = {tensor};
      ::c10d::BroadcastOptions options;
      options.rootRank = root;
      group_->broadcast(one, options)->wait();
    }
  }

  void AllGatherInPlace(const torch::Tensor& flat) override {
    if (size_ == 1) return;
    // One broadcast per segment, from its rank, in place: the same bytes
    // as an all-gather, without a copy of the whole vector. (Gloo in
    // libtorch 1.13 has no flat all-gather; its list form gathers into a
    // flat buffer of all segments and copies out, 1.9 GB at Qwen2.5-0.5B,
    // which is what sharding the optimizer saves.)
    const int64_t segment = SegmentLength(flat, "AllGatherInPlace");
    for (int r = 0; r < size_; ++r) {
      std::vector<torch::Tensor> one = {flat.narrow(0, r * segment, segment)};
      ::c10d::BroadcastOptions options;
      options.rootRank = r;
      group_->broadcast(one, options)->wait();
    }
  }

  void ReduceScatterInPlace(const torch::Tensor& flat) override {
    if (size_ == 1) return;
    // One reduction per segment, to its rank, in place: what a
    // reduce-scatter moves, without the output buffer c10d's list form
    // wants (Gloo in libtorch 1.13 has no reduce_scatter at all).
    const int64_t segment = SegmentLength(flat, "ReduceScatterInPlace");
    for (int r = 0; r < size_; ++r) {
      std::vector<torch::Tensor> one = {flat.narrow(0, r * segment, segment)};
      ::c10d::ReduceOptions options;
      options.rootRank = r;
      options.reduceOp = ::c10d::ReduceOp::SUM;
      group_->reduce(one, options)->wait();
    }
  }

 private:
  // `op` over the ranks of each tensor, in place, one collective per tensor
  // (given several, c10d would reduce them all into one).
  void AllReduceEach(const std::vector<torch::Tensor>& tensors, const ::c10d::ReduceOp& op) {
    if (size_ == 1) return;
    for (const torch::Tensor& tensor : tensors) {
      std::vector<torch::Tensor> one = {tensor};
      ::c10d::AllreduceOptions options;
      options.reduceOp = op;
      group_->allreduce(one, options)->wait();
    }
  }

  // The length of each of `flat`'s size() segments. Throws
  // std::invalid_argument naming `operation` unless `flat` is contiguous,
  // 1-D and a multiple of size() long.
  int64_t SegmentLength(const torch::Tensor& flat, const char* operation) const {
    if (flat.dim() != 1 || !flat.is_contiguous() || flat.numel() % size_ != 0) {
      throw std::invalid_argument(
          std::string(operation) +
          ": want a contiguous 1-D tensor whose size is a multiple of the " +
          std::to_string(size_) + " ranks, got " + c10::str(flat.sizes()));
    }
    return flat.numel() / size_;
  }

  c10::intrusive_ptr<Group> group_;
  const int rank_;
  const int size_;
};

// `gloo_host`: the address Gloo's sockets bind to (loopback where the
// whole group meets on loopback); empty: Gloo's default, the address this
// machine's host name resolves to, which the other hosts can reach.
std::unique_ptr<Collectives> OverStore(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                       int size, torch::Device device,
                                       std::chrono::milliseconds timeout,
                                       const std::string& gloo_host) {
  if (device.is_cuda()) {
#ifdef USE_C10D_NCCL
    auto options = ::c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return std::make_unique<C10dCollectives<::c10d::ProcessGroupNCCL>>(
        c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, rank, size, options), rank, size);
#else
    throw std::invalid_argument("collectives: CUDA device but libtorch has no NCCL");
#endif
  }
  auto options = ::c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  options->devices.push_back(gloo_host.empty()
                                 ? ::c10d::ProcessGroupGloo::createDefaultDevice()
                                 : ::c10d::ProcessGroupGloo::createDeviceForHostname(gloo_host));
  return std::make_unique<C10dCollectives<::c10d::ProcessGroupGloo>>(
      c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, size, options), rank, size);
}

}  // namespace

namespace {

void CheckRank(const CollectivesOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("collectives: rank " + std::to_string(options.rank) +
                                " outside world size " + std::to_string(options.world_size));
  }
}

struct TcpAddress {
  std::string host;
  int port = 0;  // 0: any (only where rank 0 binds)
};

// HOST and PORT of "tcp://HOST:PORT"; throws std::invalid_argument naming
// the url when it is not one (PORT 0 only where `any_port`).
TcpAddress ParseTcpStore(const std::string& url, bool any_port) {
  const std::string address = url.rfind("tcp://", 0) == 0 ? url.substr(6) : "";
  const size_t colon = address.rfind(':');
  int port = -1;
  try {
    port = colon == std::string::npos ? -1 : std::stoi(address.substr(colon + 1));
  } catch (const std::exception&) {
    port = -1;
  }
  if (colon == std::string::npos || port < (any_port ? 0 : 1) || port > 65535) {
    throw std::invalid_argument("collectives: store '" + url + "' is not tcp://HOST:PORT");
  }
  return {address.substr(0, colon), port};
}

c10::intrusive_ptr<::c10d::TCPStore> MakeTcpStore(const TcpAddress& address,
                                                  const CollectivesOptions& options,
                                                  bool wait_workers) {
  ::c10d::TCPStoreOptions tcp;
  tcp.port = static_cast<uint16_t>(address.port);
  tcp.isServer = options.rank == 0;
  tcp.numWorkers = options.world_size;
  tcp.waitWorkers = wait_workers;
  tcp.timeout = options.timeout;
  auto store = c10::make_intrusive<::c10d::TCPStore>(address.host, tcp);
  store->setTimeout(options.timeout);
  return store;
}

}  // namespace

std::string GlooBindHost(const std::string& store) {
  // A store on loopback means every rank is on this host. Otherwise the
  // store's host is rank 0's, not this rank's: Gloo's default then.
  if (store.rfind("tcp://", 0) != 0) return "";
  return base::IsLoopbackHost(ParseTcpStore(store, true).host) ? "127.0.0.1" : "";
}

c10::intrusive_ptr<::c10d::Store> ConnectStore(const CollectivesOptions& options) {
  CheckRank(options);
  const std::string& url = options.store;
  if (url.rfind("tcp://", 0) == 0) {
    return MakeTcpStore(ParseTcpStore(url, false), options, true);
  }
  if (url.rfind("file://", 0) == 0) {
    c10::intrusive_ptr<::c10d::Store> store =
        c10::make_intrusive<::c10d::FileStore>(url.substr(7), options.world_size);
    store->setTimeout(options.timeout);
    return store;
  }
  throw std::invalid_argument("collectives: store '" + url +
                              "' must be tcp://HOST:PORT or file:///PATH");
}

c10::intrusive_ptr<::c10d::Store> ServeTcpStore(const CollectivesOptions& options) {
  CheckRank(options);
  if (options.rank != 0) throw std::invalid_argument("collectives: only rank 0 serves the store");
  return MakeTcpStore(ParseTcpStore(options.store, true), options, false);
}

std::string BoundStoreUrl(const CollectivesOptions& options,
                          const c10::intrusive_ptr<::c10d::Store>& store) {
  const auto* tcp = dynamic_cast<const ::c10d::TCPStore*>(store.get());
  if (tcp == nullptr) throw std::invalid_argument("collectives: not a TCP store");
  return "tcp://" + ParseTcpStore(options.store, true).host + ":" + std::to_string(tcp->getPort());
}

std::unique_ptr<Collectives> CollectivesOverStore(const c10::intrusive_ptr<::c10d::Store>& store,
                                                  const CollectivesOptions& options) {
  return OverStore(store, options.rank, options.world_size, options.device, options.timeout,
                   GlooBindHost(options.store));
}

std::unique_ptr<Collectives> ConnectCollectives(const CollectivesOptions& options) {
  return CollectivesOverStore(ConnectStore(options), options);
}

struct InProcessRendezvous::Impl {
  int world_size;
  c10::intrusive_ptr<::c10d::Store> store = c10::make_intrusive<::c10d::HashStore>();
};

InProcessRendezvous::InProcessRendezvous(int world_size) : impl_(new Impl{world_size}) {}
InProcessRendezvous::~InProcessRendezvous() = default;

std::unique_ptr<Collectives> InProcessRendezvous::Join(int rank) {
  return OverStore(impl_->store, rank, impl_->world_size, torch::kCPU, std::chrono::seconds(60),
                   "127.0.0.1");
}

}  // namespace kappa::dist
