#include "learner/student_lora.h"

#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"

namespace kappa::learner {

namespace {

std::string TargetList(std::vector<std::string> targets) {
  std::sort(targets.begin(), targets.end());
  return absl::StrJoin(targets, ",");
}

// student.lora.init's adapter_config.json describes the adapters `lora`
// builds: rank, alpha, rsLoRA and targets (the tensors are checked when the
// learner loads them). INVALID_ARGUMENT naming the key, the file and field.
absl::Status CheckInitAgrees(const std::string& dir, const model::LoraConfig& lora) {
  const std::string file = dir + "/" + model::kAdapterConfigFile;
  std::ifstream in(file);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "student.lora.init: ", file, " cannot be read (not a PEFT adapter directory)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  model::AdapterConfig adapter;
  try {
    adapter = model::ParseAdapterConfig(text.str(), file);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("student.lora.init: ", e.what()));
  }
  const auto differs = [&](const char* field, const std::string& theirs, const char* key,
                           const std::string& ours) {
    return absl::InvalidArgumentError(absl::StrCat("student.lora.init: ", file, ": \"", field,
                                                   "\" is ", theirs, " but ", key, " is ", ours));
  };
  const model::LoraConfig& init = adapter.lora;
  if (init.rank != lora.rank) {
    return differs("r", std::to_string(init.rank), "student.lora.rank", std::to_string(lora.rank));
  }
  if (init.alpha != lora.alpha) {
    return differs("lora_alpha", absl::StrCat(init.alpha), "student.lora.alpha",
                   absl::StrCat(lora.alpha));
  }
  if (init.use_rslora != lora.use_rslora) {
    return differs("use_rslora", init.use_rslora ? "true" : "false", "student.lora.use_rslora",
                   lora.use_rslora ? "true" : "false");
  }
  if (TargetList(init.target_modules) != TargetList(lora.target_modules)) {
    return differs("target_modules", TargetList(init.target_modules), "student.lora.target_modules",
                   TargetList(lora.target_modules));
  }
  return absl::OkStatus();
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
