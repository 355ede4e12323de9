// The same-host weight broadcast: the learner (rank 0) sends every policy
// version to the rollout workers of its host (ranks 1..N) as one c10d
// broadcast per parameter, Gloo for CPU tensors and NCCL for CUDA ones, with
// gRPC as the cross-host path (learner/weight_broadcaster.h,
// rollout_worker/policy_watcher.h).
//
// The group's store carries the control: before the tensors of version
// number `sequence` (1, 2, ... in order) rank 0 writes that version's
// manifest (opaque bytes: which tensors follow, in which shapes and dtype)
// under a key of its own; a receiver polls for it, reads it, sets up its
// destination tensors and joins the broadcast. Receivers never wait inside a
// collective for a version that has not been announced, so a worker can
// stop between versions (Leave()) and the learner learns it before its next
// Send (AnyoneLeft()) instead of timing out in a collective. Rank 0 ends the
// group with Close(); receivers see kClosed at their next poll.
//
// Tensors travel as their bytes (a uint8 view: Gloo in libtorch 1.13 has
// no bfloat16), so a version arrives bit for bit in any dtype.
//
// libtorch only. Collective calls (Send, Receive) throw std::runtime_error
// when a peer is gone past the timeout; the group is then unusable (every
// rank falls back to gRPC). One thread per rank uses the group.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "dist/collectives.h"

namespace kappa::dist {

// Where and how the ranks meet: the collectives' options, with a
// tcp://HOST:PORT store (rank 0 listens, the others connect). `device`:
// Gloo for CPU tensors, NCCL for CUDA ones (each rank its own GPU).
using WeightGroupOptions = CollectivesOptions;

class WeightGroup {
 public:
  // Meets the other ranks: blocks until all world_size have joined or the
  // timeout passes. Throws std::invalid_argument on a store that is not
  // tcp://HOST:PORT, a bad rank or size, std::runtime_error when the
  // rendezvous fails.
  static std::unique_ptr<WeightGroup> Connect(const WeightGroupOptions& options);

  // Rank 0 meeting the others at a store it already serves
  // (ServeTcpStore, so that options.store may name port 0 and the others
  // are told BoundStoreUrl). Blocks and throws as Connect does.
  // REQUIRES: options.rank == 0.
  static std::unique_ptr<WeightGroup> Form(c10::intrusive_ptr<::c10d::Store> store,
                                           const WeightGroupOptions& options);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  torch::Device device() const { return device_; }

  // --- rank 0
  // Announces `manifest` as version number `sequence`, then broadcasts
  // `tensors` (contiguous, on device()) in order; returns once every
  // receiver has them. Forgets the manifests every receiver has read.
  // REQUIRES: rank 0; `sequence` is the previous one + 1, starting at 1.
  void Send(int64_t sequence, const std::string& manifest,
            const std::vector<torch::Tensor>& tensors);
  // Whether a receiver has called Leave(). REQUIRES: rank 0.
  bool AnyoneLeft();
  // Tells the receivers that no version follows. REQUIRES: rank 0.
  void Close();

  // --- ranks > 0
  enum class Poll { kNotYet, kReady, kClosed };
  // kReady with `*manifest` once rank 0 has announced `sequence`; kClosed
  // once rank 0 has closed the group (versions announced before it are
  // still kReady). Does not block.
  Poll PollManifest(int64_t sequence, std::string* manifest);
  // Receives the announced version's tensors in place: the same number,
  // byte sizes and order as rank 0 sent (contiguous, on device()). Each
  // tensor is its own collective, so the version may be received in
  // several calls, in order (one tensor at a time through a scratch
  // buffer, say). REQUIRES: PollManifest(sequence) returned kReady.
  void Receive(const std::vector<torch::Tensor>& tensors);
  // Tells rank 0 this rank takes no more versions (best effort).
  void Leave();

 private:
  WeightGroup(c10::intrusive_ptr<::c10d::Store> store, std::unique_ptr<Collectives> collectives,
              int rank, int world_size, torch::Device device);

  const c10::intrusive_ptr<::c10d::Store> store_;
  const std::unique_ptr<Collectives> collectives_;
  const int rank_;
  const int world_size_;
  const torch::Device device_;
  // Rank 0: announced sequences whose manifests some receiver has not read.
  std::vector<int64_t> unread_;
};

}  // namespace kappa::dist
