// The learner's copy of the teacher's output head for teacher.rows: hidden
// (learner/algo/teacher_head.h), read once at start-up from the teacher's
// Hugging Face checkpoint directory.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "learner/algo/teacher_head.h"

namespace kappa::learner {

// Reads `dir`/config.json (model::ReadModelConfig: an architecture or a
// config field kappa does not implement is refused by name) and the head
// tensor: "lm_head.weight", or "model.embed_tokens.weight" when
// tie_word_embeddings is set. Copies its first `vocab_limit` rows (the
// tokenizer's ids; the padded rows above them are dropped, so a teacher
// padded to 152,064 rows and a student to 151,936 over one tokenizer
// compare the same ids) to `device` in `dtype`, frozen.
// Errors, each naming the file or tensor: INVALID_ARGUMENT for a missing or
// unreadable directory, config or weights file, a missing head tensor, a
// head whose width is not config.json's hidden_size, or one with fewer rows
// than vocab_limit; vocab_limit must be > 0.
// Only the head's bytes are read (the file is memory-mapped; the layers'
// pages are never touched).
absl::StatusOr<TeacherHead> LoadTeacherHead(const std::string& dir, int64_t vocab_limit,
                                            const torch::Device& device, torch::ScalarType dtype);

}  // namespace kappa::learner
