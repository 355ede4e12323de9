#include "learner/teacher_head_loader.h"

#include <torch/torch.h>

#include <filesystem>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"

namespace kappa::learner {
namespace {

// The name of the tensor that holds the output projection's rows.
std::string HeadTensorName(const model::ModelConfig& config) {
  return config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
}

}  // namespace

absl::StatusOr<TeacherHead> LoadTeacherHead(const std::string& dir, int64_t vocab_limit,
                                            const torch::Device& device, torch::ScalarType dtype) {
  const std::string where = absl::StrCat("teacher head (teacher.rows: hidden) from ", dir);
  if (vocab_limit <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": vocabulary limit ", vocab_limit, " must be > 0"));
  }
  if (!std::filesystem::is_directory(dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a directory (teacher.checkpoint)"));
  }
  // The model code reports a bad file by throwing; every failure here is
  // the checkpoint's, so INVALID_ARGUMENT.
  constexpr absl::StatusCode kBadFile = absl::StatusCode::kInvalidArgument;
  KAPPA_ASSIGN_OR_RETURN(const model::ModelConfig config,
                         base::CaptureExceptions(
                             where, [&] { return model::ReadModelConfig(dir); }, kBadFile));
  KAPPA_ASSIGN_OR_RETURN(const model::CheckpointWeights weights,
                         base::CaptureExceptions(
                             where, [&] { return model::CheckpointWeights::Open(dir); }, kBadFile));
  const std::string name = HeadTensorName(config);
  const auto found = weights.tensors().find(name);
  if (found == weights.tensors().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", weights.description(), " has no tensor ", name));
  }
  const model::SafetensorsFile& file = *found->second.file;
  const std::vector<int64_t>& shape = found->second.entry->shape;
  if (shape.size() != 2 || shape[1] != config.hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", name, " has shape ", c10::str(at::IntArrayRef(shape)),
                     ", not [rows, ", config.hidden_size, "] (config.json hidden_size)"));
  }
  if (shape[0] < vocab_limit) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", name, " has ", shape[0],
                                                   " rows, fewer than the tokenizer's ",
                                                   vocab_limit, " ids"));
  }
  return base::CaptureExceptions(
      where,
      [&] {
        TeacherHead head;
        head.weight = file.View(name)
                          .narrow(0, 0, vocab_limit)
                          .to(device, dtype,
                              /*non_blocking=*/false,
                              /*copy=*/true);
        head.weight.set_requires_grad(false);
        file.Release(name);
        return head;
      },
      kBadFile);
}

}  // namespace kappa::learner
