// student.lora: the learner trains low-rank adapters (model/lora.h) on the
// student's frozen weights instead of every weight. The optimizer, the
// gradient clipping, κ and K_DR then see the adapters' parameters only
// (they take the parameters that require gradients).
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "services/config.h"

namespace kappa::learner {

// student.lora as the model's LoraConfig; nullopt when student.lora.rank is
// 0 (full training). INVALID_ARGUMENT naming the key (student.lora.rank,
// .alpha, .dropout, .target_modules) for a value out of range or unknown,
// and student.lora.init when its adapter_config.json cannot be read or
// describes other adapters (naming the file and field). Reads that file.
absl::StatusOr<std::optional<model::LoraConfig>> StudentLoraConfig(const services::Config& config);

// Attaches fresh adapters (B = 0: the model computes what it did) and
// freezes every other parameter, so only the adapters train.
// REQUIRES: `student` has no adapters yet.
void TrainAdaptersOnly(model::Decoder& student, const model::LoraConfig& lora);

// Freezes every parameter of `student` but its adapters (after an adapter
// was loaded into it).
void FreezeAllButAdapters(model::Decoder& student);

}  // namespace kappa::learner
