#include "learner/policy_snapshot_dtype.h"

namespace kappa::learner {

torch::ScalarType PolicySnapshotDtype(const services::Config& config) {
  const std::string& wire = config.rollout.weights_dtype;
  const bool bfloat16 =
      wire == "bfloat16" || (wire == "auto" && config.student.dtype == "bfloat16");
  return bfloat16 ? torch::kBFloat16 : torch::kFloat32;
}

}  // namespace kappa::learner
