// What a data-parallel learner needs from torch's c10d: sum tensors across
// the ranks and broadcast one rank's tensors, on Gloo (CPU) or NCCL (CUDA).
// Every rank ends a SumInPlace with the same bits, which is what keeps the
// ranks' parameters bitwise identical step after step.
//
// libtorch only. Calls are collective: every rank must make the same calls
// in the same order with tensors of the same shapes, or they block until the
// store's timeout (std::runtime_error from c10d).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace kappa::dist {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Elementwise sum over ranks of each tensor, in place, one collective per
  // tensor (contiguous, on the group's device).
  virtual void SumInPlace(const std::vector<torch::Tensor>& tensors) = 0;
  // Elementwise maximum over ranks of each tensor, in place.
  virtual void MaxInPlace(const std::vector<torch::Tensor>& tensors) = 0;
  // Copies rank `root`'s tensors into every other rank's, in place.
  virtual void Broadcast(const std::vector<torch::Tensor>& tensors, int root) = 0;
  // `flat` (1-D, contiguous, on the group's device, numel a multiple of
  // size()) as size() equal segments: every rank's segment `rank` is copied
  // into segment `rank` of every other rank's, in place. What a rank holds
  // outside its own segment beforehand is overwritten. No copy of `flat`
  // is made (size() broadcasts, each segment from its rank).
  virtual void AllGatherInPlace(const torch::Tensor& flat) = 0;
  // AllGatherInPlace's converse: `flat` (as there) as size() equal
  // segments; afterwards segment `rank` of this rank's `flat` holds the
  // sum over ranks of every rank's segment `rank`. What this rank holds
  // outside its own segment is unspecified afterwards (it may be a partial
  // sum). No copy of `flat` is made (size() reductions, each segment to
  // its rank): the reduce-scatter of a sharded gradient.
  virtual void ReduceScatterInPlace(const torch::Tensor& flat) = 0;
};

struct CollectivesOptions {
  // Where the ranks meet: "tcp://HOST:PORT" (rank 0 listens on PORT, the
  // others connect to HOST:PORT) or "file:///PATH" (a file on storage every
  // rank sees; it must not exist from an earlier run).
  std::string store;
  int rank = 0;
  int world_size = 1;
  // Gloo for CPU; NCCL for CUDA (when libtorch was built with it).
  torch::Device device = torch::kCPU;
  // Rendezvous and each collective give up after this long.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

// Connects to the other ranks (blocks until all world_size have joined or
// the timeout passes). Throws std::invalid_argument on a bad store address,
// rank or size, std::runtime_error when the rendezvous fails.
std::unique_ptr<Collectives> ConnectCollectives(const CollectivesOptions& options);

// The store of `options` alone (rank 0 of a tcp:// store serves it and
// waits until all world_size ranks have connected, or the timeout). Throws
// as ConnectCollectives does.
c10::intrusive_ptr<::c10d::Store> ConnectStore(const CollectivesOptions& options);

// Rank 0's end of a tcp://HOST:PORT store, listening when this returns and
// not waiting for anyone: PORT 0 lets the kernel choose, and BoundStoreUrl
// says which, so the others can be told the address before they connect
// (nothing picks a port that another process might take first). The group
// meets later in CollectivesOverStore. Throws as ConnectStore does
// (std::runtime_error when HOST:PORT cannot be bound).
c10::intrusive_ptr<::c10d::Store> ServeTcpStore(const CollectivesOptions& options);

// tcp://HOST:PORT of a store ServeTcpStore returned, PORT the bound one.
std::string BoundStoreUrl(const CollectivesOptions& options,
                          const c10::intrusive_ptr<::c10d::Store>& store);

// The address Gloo's sockets bind to for a group meeting at `store`:
// "127.0.0.1" for a tcp:// store on loopback (base::IsLoopbackHost:
// every rank on this host), else "" (Gloo's default, the address this
// host's name resolves to: reachable from the other hosts). Throws as
// ConnectStore does on a bad tcp:// address.
std::string GlooBindHost(const std::string& store);

// A process group of options.rank / world_size / device over `store`
// (options.store is not read). Blocks until every rank has joined.
std::unique_ptr<Collectives> CollectivesOverStore(const c10::intrusive_ptr<::c10d::Store>& store,
                                                  const CollectivesOptions& options);

// For tests: `world_size` ranks in this process, one per thread, meeting
// in an in-memory store. Call from each rank's own thread.
class InProcessRendezvous {
 public:
  explicit InProcessRendezvous(int world_size);
  ~InProcessRendezvous();
  std::unique_ptr<Collectives> Join(int rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kappa::dist
