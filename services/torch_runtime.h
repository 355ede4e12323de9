// libtorch process settings: threads, so several processes on one machine do
// not oversubscribe the cores, and the device a process computes on.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/config_choices.h"

namespace kappa::services {

// intra_op_threads > 0 sets at::set_num_threads; inter-op threads are set to 1
// (kappa runs no inter-op parallel graphs). 0 keeps libtorch's default.
void ConfigureTorchThreads(int64_t intra_op_threads);

// Tensor buffers of `bytes` or more are mapped from the system and unmapped
// when freed (glibc's M_MMAP_THRESHOLD, fixed instead of glibc's sliding
// default, which climbs to 32 MiB). Below it, a freed buffer stays in the
// arena of the thread that freed it, and a process whose threads take turns
// allocating O(V) rows (the teacher's batching and handler threads) keeps
// every arena's high-water mark resident: its peak RSS then depends on the
// threads' timing, not on what is live (issue 38: 593-686 MiB for one
// 2-step run). Call once, at start-up, before threads start.
void ReturnLargeBuffersToTheSystem(int64_t bytes = int64_t{4} << 20);

// Hands the heap's free pages back to the system (malloc_trim): after a
// start-up step that built and dropped large transient structures (the
// teacher's tokenizer.json parse, ~90 MiB at Qwen's vocabulary), so they do
// not count in the resident set for the rest of the run.
void ReleaseFreedHeap();

// The device a config key names: "cpu", "cuda" or "cuda:N". INVALID_ARGUMENT
// naming `key` for anything else, FAILED_PRECONDITION when CUDA is asked for
// and this libtorch has no CUDA device (a CPU build, or no GPU visible).
absl::StatusOr<torch::Device> ResolveDevice(const std::string& name, const std::string& key);

// The parameter dtype of a model that runs on `device`: bfloat16, float32,
// or for kAuto bfloat16 on CUDA and float32 on the CPU (where bf16 matmuls
// are slow).
torch::ScalarType ResolveModelDtype(ModelDtype dtype, const torch::Device& device);

}  // namespace kappa::services
