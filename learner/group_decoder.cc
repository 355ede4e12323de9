#include "learner/group_decoder.h"

#include "absl/strings/str_cat.h"
#include "kappa/v1/teacher.pb.h"
#include "services/torch_tensor_codec.h"

namespace kappa::learner {
namespace {

absl::Status CheckTokens(const google::protobuf::RepeatedField<int32_t>& tokens,
                         const std::string& field, int64_t vocab_size) {
  for (int i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: token id ", tokens[i],
                                                     " outside [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScoredGroup> DecodeScoredGroup(const kappa::v1::ScoredGroup& message,
                                              const GroupExpectations& expect) {
  if (message.samples_size() != expect.group_size) {
    return absl::InvalidArgumentError(absl::StrCat("samples: expected ", expect.group_size,
                                                   " samples, got ", message.samples_size()));
  }
  if (message.prompt_tokens().empty()) {
    return absl::InvalidArgumentError("prompt_tokens: empty");
  }
  if (auto status = CheckTokens(message.prompt_tokens(), "prompt_tokens", expect.vocab_size);
      !status.ok()) {
    return status;
  }
  ScoredGroup group;
  group.prompt_tokens.assign(message.prompt_tokens().begin(), message.prompt_tokens().end());
  group.policy_version = message.policy_version();
  group.samples.reserve(message.samples_size());
  for (int i = 0; i < message.samples_size(); ++i) {
    const kappa::v1::ScoredSample& in = message.samples(i);
    const std::string field = absl::StrCat("samples[", i, "]");
    const int64_t length = in.response_tokens_size();
    if (length == 0) return absl::InvalidArgumentError(field + ".response_tokens: empty");
    if (length > expect.max_new_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".response_tokens: length ", length,
                                                     " exceeds max_new_tokens ",
                                                     expect.max_new_tokens));
    }
    if (auto status = CheckTokens(in.response_tokens(), field + ".response_tokens",
                                  expect.vocab_size);
        !status.ok()) {
      return status;
    }
    if (in.reward() != 0.0f && in.reward() != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".reward: ", in.reward(), " is not 0 or 1"));
    }
    auto behavior = services::DecodeTensor(in.behavior_logprobs(), field + ".behavior_logprobs");
    if (!behavior.ok()) return behavior.status();
    if (behavior->dim() != 1 || behavior->size(0) != length) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".behavior_logprobs: expected shape [", length, "], got ",
          c10::str(behavior->sizes())));
    }
    ScoredSample sample;
    sample.response_tokens.assign(in.response_tokens().begin(), in.response_tokens().end());
    auto behavior_f32 = behavior->to(torch::kFloat32).contiguous();
    sample.behavior_logprobs.assign(behavior_f32.data_ptr<float>(),
                                    behavior_f32.data_ptr<float>() + length);
    sample.reward = in.reward();
    if (expect.teacher_form != 0) {
      auto teacher = services::DecodeTensor(in.teacher_logprobs(), field + ".teacher_logprobs");
      if (!teacher.ok()) return teacher.status();
      const bool full = expect.teacher_form == kappa::v1::SCORE_FORM_FULL;
      const bool shape_ok = full ? (teacher->dim() == 2 && teacher->size(0) == length &&
                                    teacher->size(1) == expect.vocab_size)
                                 : (teacher->dim() == 1 && teacher->size(0) == length);
      if (!shape_ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".teacher_logprobs: shape ", c10::str(teacher->sizes()), " does not match ",
            full ? absl::StrCat("[", length, ", ", expect.vocab_size, "]")
                 : absl::StrCat("[", length, "]")));
      }
      sample.teacher_logprobs = teacher->to(torch::kFloat32);
    }
    group.samples.push_back(std::move(sample));
  }
  return group;
}

}  // namespace kappa::learner
