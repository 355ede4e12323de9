#include "learner/teacher_head_loader.h"

#include <torch/torch.h>

#include <exception>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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
  model::ModelConfig config;
  try {
    config = model::ReadModelConfig(dir);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", e.what()));
  }
  const std::string name = HeadTensorName(config);
  try {
    const model::CheckpointWeights weights = model::CheckpointWeights::Open(dir);
    const auto found = weights.tensors().find(name);
    if (found == weights.tensors().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", weights.description(), " has no tensor ", name));
    }
    const torch::Tensor head = found->second.file->View(name);
    if (head.dim() != 2 || head.size(1) != config.hidden_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", name, " has shape ", c10::str(head.sizes()), ", not [rows, ",
                       config.hidden_size, "] (config.json hidden_size)"));
    }
    if (head.size(0) < vocab_limit) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", name, " has ", head.size(0),
                                                     " rows, fewer than the tokenizer's ",
                                                     vocab_limit, " ids"));
    }
    TeacherHead out;
    out.weight = head.narrow(0, 0, vocab_limit)
                     .to(device, dtype, /*non_blocking=*/false,
                         /*copy=*/true);
    out.weight.set_requires_grad(false);
    found->second.file->Release(name);
    return out;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", e.what()));
  }
}

}  // namespace kappa::learner
