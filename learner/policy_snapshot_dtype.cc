#include "learner/policy_snapshot_dtype.h"

namespace kappa::learner {

torch::ScalarType PolicySnapshotDtype(const services::Config& config) {
  using services::ModelDtype;
  const ModelDtype wire = config.rollout.weights_dtype;
  const bool bfloat16 =
      wire == ModelDtype::kBFloat16 ||
      (wire == ModelDtype::kAuto && config.student.dtype == ModelDtype::kBFloat16);
  return bfloat16 ? torch::kBFloat16 : torch::kFloat32;
}

}  // namespace kappa::learner
