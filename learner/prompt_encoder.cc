#include "learner/prompt_encoder.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kappa::learner {
namespace {

// The model library's errors name the file; each is the run's bad input.
absl::StatusOr<model::TextTokenizer> LoadTokenizer(const std::string& dir, const char* role) {
  return base::CaptureExceptions(
      absl::StrCat(role, " tokenizer"), [&] { return model::TextTokenizer::ForModel(dir); },
      absl::StatusCode::kInvalidArgument);
}

}  // namespace

absl::StatusOr<PromptEncoder> PromptEncoder::ForRun(const services::Config& config,
                                                    const std::string& student_dir,
                                                    const std::string& teacher_dir) {
  absl::StatusOr<model::TextTokenizer> student = LoadTokenizer(student_dir, "student");
  if (!student.ok()) return student.status();
  absl::StatusOr<model::TextTokenizer> teacher = LoadTokenizer(teacher_dir, "teacher");
  if (!teacher.ok()) return teacher.status();
  if (auto mismatch = model::TokenizerMismatch(*student, *teacher)) {
    return absl::InvalidArgumentError(*mismatch);
  }
  absl::StatusOr<tasks::PromptFormat> format =
      tasks::PromptFormat::Make(config.task.prompt_template, config.task.system_prompt, student_dir,
                                config.task.chat_template_context);
  if (!format.ok()) return format.status();
  return PromptEncoder(*std::move(student), *std::move(format));
}

PromptEncoder PromptEncoder::Character() {
  return PromptEncoder(model::TextTokenizer::Character(),
                       tasks::PromptFormat::Make("raw", "", "").value());
}

absl::StatusOr<std::vector<int64_t>> PromptEncoder::Encode(const tasks::Example& example) const {
  absl::StatusOr<std::string> text = format_.Render(example);
  if (!text.ok()) return text.status();
  // Invalid UTF-8, a character outside the alphabet: the example's fault.
  return base::CaptureExceptions(
      absl::StrCat("example ", example.id),
      [&] { return tokenizer_.Encode(*text, format_.add_special_tokens()); },
      absl::StatusCode::kInvalidArgument);
}

absl::StatusOr<std::vector<std::vector<int64_t>>> PromptEncoder::EncodeAll(
    const tasks::Dataset& dataset, const std::string& what) const {
  std::vector<std::vector<int64_t>> prompts;
  prompts.reserve(dataset.size());
  for (size_t i = 0; i < dataset.size(); ++i) {
    absl::StatusOr<std::vector<int64_t>> ids = Encode(dataset.at(i));
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " prompts: ", ids.status().message()));
    }
    prompts.push_back(*std::move(ids));
  }
  return prompts;
}

std::string PromptEncoder::DecodeResponse(const std::vector<int64_t>& ids) const {
  return tokenizer_.Decode(ids, /*skip_special_tokens=*/true);
}

}  // namespace kappa::learner
