#include "learner/group_decoder.h"

#include <google/protobuf/stubs/common.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kappa/v1/teacher.pb.h"
#include "services/tensor_codec.h"
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

// A response (sampled or teacher) the loss can take: non-empty, within the
// length the work item allowed, every id inside the vocabulary.
absl::Status CheckResponse(const google::protobuf::RepeatedField<int32_t>& tokens,
                           const std::string& field, const GroupExpectations& expect) {
  const int64_t length = tokens.size();
  if (length == 0) return absl::InvalidArgumentError(field + ": empty");
  if (length > expect.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": length ", length,
                                                   " exceeds max_new_tokens ",
                                                   expect.max_new_tokens));
  }
  return CheckTokens(tokens, field, expect.vocab_size);
}

}  // namespace

absl::Status CheckPositions(const kappa::v1::ScoredGroup& message,
                            const GroupExpectations& expect) {
  if (expect.max_positions <= 0) return absl::OkStatus();
  const int64_t prompt = message.prompt_tokens_size();
  if (prompt >= expect.max_positions) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_tokens: length ", prompt,
                     " leaves no position for a response (the student's "
                     "max_position_embeddings is ",
                     expect.max_positions, ")"));
  }
  const auto fits = [&](int64_t response, const std::string& field) {
    if (prompt + response <= expect.max_positions) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", prompt, " prompt + ", response,
        " response tokens exceed the student's max_position_embeddings ", expect.max_positions));
  };
  for (int i = 0; i < message.samples_size(); ++i) {
    const int64_t length = message.samples(i).response_tokens_size();
    if (absl::Status status = fits(length, absl::StrCat("samples[", i, "].response_tokens"));
        !status.ok()) {
      return status;
    }
  }
  for (int i = 0; i < message.demonstrations_size(); ++i) {
    const int64_t length = message.demonstrations(i).response_tokens_size();
    if (absl::Status status = fits(length, absl::StrCat("demonstrations[", i, "].response_tokens"));
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

namespace {

// Text is only logged and reported, but a report that cannot be written as
// UTF-8 (JSON) would fail far from its cause. The fields are bytes on the
// wire (learner.proto), so this is the check.
absl::Status CheckText(const std::string& text, const std::string& field) {
  if (!google::protobuf::internal::IsStructurallyValidUTF8(text.data(),
                                                           static_cast<int>(text.size()))) {
    return absl::InvalidArgumentError(field + ": not valid UTF-8");
  }
  return absl::OkStatus();
}

// Log-probabilities as the loss reads them: a floating dtype (an int32 tensor
// of the right byte count would otherwise be converted silently), every value
// finite (the codec names the first NaN/Inf).
absl::StatusOr<torch::Tensor> DecodeLogProbs(const kappa::v1::Tensor& wire,
                                             const std::string& field) {
  const kappa::v1::DType dtype = wire.dtype();
  if (dtype == kappa::v1::DTYPE_INT32 || dtype == kappa::v1::DTYPE_INT64) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": dtype ", std::string(services::DTypeName(dtype)),
                     " is not a floating type (float32, bfloat16 or float16)"));
  }
  return services::DecodeTensor(wire, field);
}

// Log-probs above 0 by more than rounding are no log-probs. A teacher's
// log_softmax gives at most 0 for the top token; the slack admits an
// implementation (or a bfloat16 wire) that rounds up by a few ulps.
constexpr float kMaxLogProb = 1e-3f;

// Row and column of the first true entry of a 2-D bool tensor, if any: each
// TOPK check is one vectorised pass, and the first offending entry is named.
std::optional<std::pair<int64_t, int64_t>> FirstTrue(const torch::Tensor& mask) {
  if (!mask.any().item<bool>()) return std::nullopt;
  const torch::Tensor at = mask.nonzero()[0];
  return std::make_pair(at[0].item<int64_t>(), at[1].item<int64_t>());
}

// SCORE_FORM_TOPK's teacher_tail_logmass: float32 [T], each entry log q(T)
// <= 0 (rounding slack as for a log-prob) or −inf (an empty tail, k = V).
// Required: rebuilding it from the k values (1 − Σ top-k) is what it
// replaces, and is off by many nats on a peaked bfloat16 row.
absl::StatusOr<torch::Tensor> DecodeTailLogMass(const kappa::v1::ScoredSample& in, int64_t length,
                                                const std::string& field) {
  const std::string tail_field = field + ".teacher_tail_logmass";
  if (!in.has_teacher_tail_logmass()) {
    return absl::InvalidArgumentError(
        absl::StrCat(tail_field,
                     ": missing; the TOPK form needs the teacher's float32 tail "
                     "mass (a teacher or worker that predates it)"));
  }
  if (in.teacher_tail_logmass().dtype() != kappa::v1::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(
        tail_field, ": dtype ", std::string(services::DTypeName(in.teacher_tail_logmass().dtype())),
        " is not float32 (the tail mass is sent in float32 whatever the values' dtype)"));
  }
  auto tail = services::DecodeTensor(in.teacher_tail_logmass(), tail_field,
                                     /*reject_non_finite=*/false);  // −inf: an empty tail
  if (!tail.ok()) return tail.status();
  if (tail->dim() != 1 || tail->size(0) != length) {
    return absl::InvalidArgumentError(absl::StrCat(tail_field, ": shape ", c10::str(tail->sizes()),
                                                   " does not match [", length, "]"));
  }
  const torch::Tensor bad = (*tail > kMaxLogProb).logical_or(torch::isnan(*tail));
  if (bad.any().item<bool>()) {
    const int64_t t = bad.nonzero()[0][0].item<int64_t>();
    return absl::InvalidArgumentError(absl::StrCat(tail_field, "[", t,
                                                   "]: ", (*tail)[t].item<float>(),
                                                   " is not a log-mass (want <= 0 or -inf)"));
  }
  return tail->clamp_max(0.0).contiguous();
}

// SCORE_FORM_HIDDEN: teacher_hidden [T, D_t] of the head's width, floating,
// finite (the codec names the first NaN or infinity), and no log-probs.
absl::StatusOr<torch::Tensor> DecodeTeacherHidden(const kappa::v1::ScoredSample& in, int64_t length,
                                                  const std::string& field,
                                                  const GroupExpectations& expect) {
  const std::string hidden_field = field + ".teacher_hidden";
  if (!in.has_teacher_hidden()) {
    return absl::InvalidArgumentError(
        absl::StrCat(hidden_field, ": missing; the work item asked for the HIDDEN form"));
  }
  if (in.has_teacher_logprobs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".teacher_logprobs: set in the HIDDEN form (send teacher_hidden only)"));
  }
  auto hidden = DecodeLogProbs(in.teacher_hidden(), hidden_field);
  if (!hidden.ok()) return hidden.status();
  if (hidden->dim() != 2 || hidden->size(0) != length ||
      hidden->size(1) != expect.teacher_hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(hidden_field, ": shape ", c10::str(hidden->sizes()), " does not match [",
                     length, ", ", expect.teacher_hidden_size, "] (the teacher head's width is ",
                     expect.teacher_hidden_size, ")"));
  }
  return hidden->contiguous();
}

// SCORE_FORM_TOPK: teacher_logprobs [T, k] and teacher_topk_ids [T, k] with
// k = min(top_k, V), distinct ids in [0, V) per row, finite log-probs <= 0,
// and teacher_tail_logmass [T] (DecodeTailLogMass).
// They stay compact through the learner (TrainBatch::teacher_topk_ids): the
// top-k losses, their logit gradients, K_DR and RSTG read the k ids and
// values; no [T, V] row is made (bench/README.md has the bytes per token).
absl::Status DecodeTopkTeacher(const kappa::v1::ScoredSample& in, int64_t length,
                               const std::string& field, const GroupExpectations& expect,
                               ScoredSample& sample) {
  const int64_t vocab = expect.vocab_size;
  if (expect.teacher_top_k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".teacher_topk_ids: the work item asked for top_k ",
                     expect.teacher_top_k, " (must be > 0 for the TOPK form)"));
  }
  const int64_t k = std::min<int64_t>(expect.teacher_top_k, vocab);
  const std::string expected_shape = absl::StrCat("[", length, ", ", k, "]");
  auto values = DecodeLogProbs(in.teacher_logprobs(), field + ".teacher_logprobs");
  if (!values.ok()) return values.status();
  if (values->dim() != 2 || values->size(0) != length || values->size(1) != k) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".teacher_logprobs: shape ", c10::str(values->sizes()),
                     " does not match ", expected_shape, " (top_k ", k, ")"));
  }
  const std::string ids_field = field + ".teacher_topk_ids";
  const kappa::v1::DType ids_dtype = in.teacher_topk_ids().dtype();
  if (ids_dtype != kappa::v1::DTYPE_INT32 && ids_dtype != kappa::v1::DTYPE_INT64) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids_field, ": dtype ", std::string(services::DTypeName(ids_dtype)),
                     " is not an integer type (int32 or int64)"));
  }
  auto ids = services::DecodeTensor(in.teacher_topk_ids(), ids_field);
  if (!ids.ok()) return ids.status();
  if (ids->dim() != 2 || ids->size(0) != length || ids->size(1) != k) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids_field, ": shape ", c10::str(ids->sizes()), " does not match ",
                     expected_shape, " (top_k ", k, ")"));
  }
  const torch::Tensor id64 = ids->to(torch::kInt64);
  if (const auto at = FirstTrue((id64 < 0).logical_or(id64 >= vocab))) {
    const auto [t, j] = *at;
    return absl::InvalidArgumentError(
        absl::StrCat(ids_field, "[", t, ", ", j, "]: token id ", id64[t][j].item<int64_t>(),
                     " outside [0, ", vocab, ")"));
  }
  if (k > 1) {
    const torch::Tensor sorted = std::get<0>(id64.sort(1));
    if (const auto at = FirstTrue(sorted.narrow(1, 1, k - 1) == sorted.narrow(1, 0, k - 1))) {
      const auto [t, j] = *at;
      return absl::InvalidArgumentError(absl::StrCat(
          ids_field, "[", t, "]: token id ", sorted[t][j].item<int64_t>(), " appears twice"));
    }
  }
  const torch::Tensor logprobs = values->to(torch::kFloat32);
  if (const auto at = FirstTrue((logprobs > kMaxLogProb).logical_or(~torch::isfinite(logprobs)))) {
    const auto [t, j] = *at;
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".teacher_logprobs[", t, ", ", j, "]: ", logprobs[t][j].item<float>(),
                     " is not a log-probability (want finite and <= 0)"));
  }
  auto tail = DecodeTailLogMass(in, length, field);
  if (!tail.ok()) return tail.status();
  sample.teacher_logprobs = logprobs.contiguous();
  sample.teacher_topk_ids = id64.contiguous();
  sample.teacher_tail_logmass = *std::move(tail);
  return absl::OkStatus();
}

// RSTG teacher SFT data: only for a work item that asked for it, only for a
// negative zero-variance group (the worker asks the teacher in no other
// case, so anything else is a worker bug the NLL term must not train on).
absl::Status DecodeDemonstrations(const kappa::v1::ScoredGroup& message,
                                  const GroupExpectations& expect, ScoredGroup& group) {
  const int count = message.demonstrations_size();
  if (count == 0) return absl::OkStatus();
  if (expect.teacher_demonstrations <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "demonstrations: ", count, " given but the work item asked for none"));
  }
  if (count > expect.teacher_demonstrations) {
    return absl::InvalidArgumentError(absl::StrCat("demonstrations: ", count,
                                                   " given, the work item asked for at most ",
                                                   expect.teacher_demonstrations));
  }
  for (size_t i = 0; i < group.samples.size(); ++i) {
    if (group.samples[i].reward != 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "demonstrations: only allowed when every reward is 0, but samples[", i, "].reward is ",
          group.samples[i].reward));
    }
  }
  group.teacher_demonstrations.reserve(count);
  for (int i = 0; i < count; ++i) {
    const google::protobuf::RepeatedField<int32_t>& tokens =
        message.demonstrations(i).response_tokens();
    if (absl::Status status =
            CheckResponse(tokens, absl::StrCat("demonstrations[", i, "].response_tokens"), expect);
        !status.ok()) {
      return status;
    }
    if (absl::Status status = CheckText(message.demonstrations(i).response_text(),
                                        absl::StrCat("demonstrations[", i, "].response_text"));
        !status.ok()) {
      return status;
    }
    group.teacher_demonstrations.emplace_back(tokens.begin(), tokens.end());
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
    if (auto status = CheckResponse(in.response_tokens(), field + ".response_tokens", expect);
        !status.ok()) {
      return status;
    }
    if (in.reward() != 0.0f && in.reward() != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".reward: ", in.reward(), " is not 0 or 1"));
    }
    if (auto status = CheckText(in.response_text(), field + ".response_text"); !status.ok()) {
      return status;
    }
    auto behavior = DecodeLogProbs(in.behavior_logprobs(), field + ".behavior_logprobs");
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
    sample.truncated = in.truncated();
    if (expect.teacher_form == kappa::v1::SCORE_FORM_TOPK) {
      if (absl::Status status = DecodeTopkTeacher(in, length, field, expect, sample);
          !status.ok()) {
        return status;
      }
    } else if (expect.teacher_form == kappa::v1::SCORE_FORM_HIDDEN) {
      auto hidden = DecodeTeacherHidden(in, length, field, expect);
      if (!hidden.ok()) return hidden.status();
      sample.teacher_hidden = *std::move(hidden);
    } else if (expect.teacher_form != 0) {
      auto teacher = DecodeLogProbs(in.teacher_logprobs(), field + ".teacher_logprobs");
      if (!teacher.ok()) return teacher.status();
      const bool full = expect.teacher_form == kappa::v1::SCORE_FORM_FULL;
      // A teacher with another vocabulary gives rows that do not line up
      // with the student's token ids: name that rather than a bare shape.
      if (full && teacher->dim() == 2 && teacher->size(0) == length &&
          teacher->size(1) != expect.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".teacher_logprobs: teacher vocabulary size ", teacher->size(1),
            " does not match the student's ", expect.vocab_size));
      }
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
  if (absl::Status status = DecodeDemonstrations(message, expect, group); !status.ok()) {
    return status;
  }
  return group;
}

absl::Status CheckPolicyVersion(int64_t policy_version, int64_t latest_published) {
  // Before the first publication work items carry version 0.
  const int64_t newest = std::max<int64_t>(latest_published, 0);
  if (policy_version < 0 || policy_version > newest) {
    return absl::InvalidArgumentError(absl::StrCat("policy_version: ", policy_version,
                                                   " was never published (latest is ",
                                                   newest, ")"));
  }
  return absl::OkStatus();
}

}  // namespace kappa::learner
