#include "learner/student_lora.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/checkpoint.h"

namespace kappa::learner {

absl::StatusOr<std::optional<model::LoraConfig>> StudentLoraConfig(const services::Config& config) {
  const services::Config::Student::Lora& keys = config.student.lora;
  if (keys.rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("student.lora.rank must be >= 0 (0: no adapters), got ", keys.rank));
  }
  if (keys.rank == 0) return std::optional<model::LoraConfig>();
  model::LoraConfig lora;
  lora.rank = keys.rank;
  lora.alpha = keys.alpha;
  lora.dropout = keys.dropout;
  lora.use_rslora = keys.use_rslora;
  lora.target_modules = keys.target_modules;
  try {
    lora.Validate();
  } catch (const std::invalid_argument& e) {
    // Validate names the field as "lora.<field>".
    return absl::InvalidArgumentError(absl::StrCat("student.", e.what()));
  }
  return std::optional<model::LoraConfig>(lora);
}

void FreezeAllButAdapters(model::Decoder& student) {
  for (const auto& parameter : student->named_parameters()) {
    parameter.value().set_requires_grad(model::IsAdapterName(parameter.key()));
  }
}

void TrainAdaptersOnly(model::Decoder& student, const model::LoraConfig& lora) {
  student->EnableLora(lora);
  FreezeAllButAdapters(student);
}

}  // namespace kappa::learner
