// The dtype the learner snapshots each policy version in (PolicySnapshot).
//
// A snapshot is a deep copy of the student taken on the training thread at
// every version. When every worker is configured to ask for bfloat16 weights
// the learner copies straight into bfloat16: at Qwen2.5-0.5B that is 0.99 GB
// per version instead of a 1.98 GB float32 copy that a bfloat16 encoding
// then halves again (issue 38: a 0.5B run on a 24 GiB host did not fit with
// both). Otherwise the snapshot stays float32, from which any wire dtype can
// be encoded exactly.
#pragma once

#include <torch/types.h>

#include "services/config.h"

namespace kappa::learner {

// bfloat16 when the configuration makes every worker ask for bfloat16:
// rollout.weights_dtype is "bfloat16", or "auto" with student.dtype
// "bfloat16" (the worker's model dtype, which "auto" follows). float32
// otherwise, including student.dtype "auto", which a worker resolves on its
// own host. A worker asking a bfloat16-snapshot learner for float32 is
// refused (LearnerService::WatchPolicy), never sent widened bfloat16.
torch::ScalarType PolicySnapshotDtype(const services::Config& config);

}  // namespace kappa::learner
