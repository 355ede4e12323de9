#include "learner/student_lora.h"

#include <torch/torch.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"

namespace kappa::learner {

namespace {

// student.lora's key for a field of adapter_config.json.
const char* LoraKeyOf(const std::string& peft_field) {
  if (peft_field == "r") return "student.lora.rank";
  if (peft_field == "lora_alpha") return "student.lora.alpha";
  if (peft_field == "use_rslora") return "student.lora.use_rslora";
  return "student.lora.target_modules";
}

// student.lora.init's adapter_config.json describes the adapters `lora`
// builds: rank, alpha, rsLoRA and targets (the tensors are checked when the
// learner loads them). INVALID_ARGUMENT naming the key, the file and field.
absl::Status CheckInitAgrees(const std::string& dir, const model::LoraConfig& lora) {
  model::AdapterConfig adapter;
  try {
    adapter = model::ReadAdapterConfig(dir);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("student.lora.init: ", e.what()));
  }
  const std::optional<model::AdapterConfigDifference> d =
      model::FirstDifference(adapter.lora, lora);
  if (!d.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("student.lora.init: ", dir, "/", model::kAdapterConfigFile, ": \"", d->field,
                   "\" is ", d->ours, " but ", LoraKeyOf(d->field), " is ", d->theirs));
}

}  // namespace

absl::StatusOr<std::optional<model::LoraConfig>> StudentLoraConfig(const services::Config& config) {
  const services::Config::Student::Lora& keys = config.student.lora;
  if (keys.rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("student.lora.rank must be >= 0 (0: no adapters), got ", keys.rank));
  }
  if (keys.rank == 0) {
    if (!keys.init.empty()) {
      return absl::InvalidArgumentError(
          "student.lora.init is set but student.lora.rank is 0; give the adapter's rank");
    }
    return std::optional<model::LoraConfig>();
  }
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
  if (!keys.init.empty()) {
    if (absl::Status agrees = CheckInitAgrees(keys.init, lora); !agrees.ok()) return agrees;
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
