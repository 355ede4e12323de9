// How the learner turns a task example into the prompt ids it leases and
// evaluates, and a response back into the text the exact-answer reward reads:
// the task's PromptFormat (task.prompt_template) rendered, then encoded with
// the student's tokenizer (model::TextTokenizer: its tokenizer.json, or the
// character tokenizer of kappa's toy models).
//
// Immutable; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/text_tokenizer.h"
#include "services/config.h"
#include "tasks/dataset.h"
#include "tasks/prompt_format.h"

namespace kappa::learner {

class PromptEncoder {
 public:
  PromptEncoder(model::TextTokenizer tokenizer, tasks::PromptFormat format)
      : tokenizer_(std::move(tokenizer)), format_(std::move(format)) {}

  // The run's encoder: the student's tokenizer (from student_dir) and
  // config.task's prompt keys. Refuses (INVALID_ARGUMENT, naming both
  // tokenizer files) a teacher whose tokenizer differs from the student's:
  // on-policy distillation compares their distributions id by id.
  static absl::StatusOr<PromptEncoder> ForRun(const services::Config& config,
                                              const std::string& student_dir,
                                              const std::string& teacher_dir);
  // Raw prompts with the character tokenizer (BOS first): `kappa sft` of the
  // toy models.
  static PromptEncoder Character();

  // INVALID_ARGUMENT naming the example: the chat template refused it, or the
  // tokenizer cannot encode its text.
  absl::StatusOr<std::vector<int64_t>> Encode(const tasks::Example& example) const;
  // Every example's prompt ids, in dataset order; the first error names its
  // example and `what` ("train", "held-out").
  absl::StatusOr<std::vector<std::vector<int64_t>>> EncodeAll(const tasks::Dataset& dataset,
                                                              const std::string& what) const;
  // The response's text as the verifier sees it (special tokens skipped, as
  // vLLM and transformers decode by default). Never throws.
  std::string DecodeResponse(const std::vector<int64_t>& ids) const;

  const model::TextTokenizer& tokenizer() const { return tokenizer_; }

 private:
  model::TextTokenizer tokenizer_;
  tasks::PromptFormat format_;
};

}  // namespace kappa::learner
