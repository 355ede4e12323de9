#include "learner/work_config.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kappa/v1/teacher.pb.h"

namespace kappa::learner {
namespace {

bool HasBalance(const services::Config& config, services::BalanceMethod method) {
  const std::vector<services::BalanceMethod>& balance = config.trainer.balance;
  return std::find(balance.begin(), balance.end(), method) != balance.end();
}

// The log-prob form the loss reads (teacher.rows: logprobs).
int32_t LogProbFormFor(const services::Config& config) {
  // GRPO only: the loss never looks at the teacher.
  if (config.trainer.distill_gate == services::DistillGate::kNone) return 0;
  // λ = 0 switches distillation off, unless a balancer sets the scale of the
  // distillation gradient itself (m3_norm) or moves λ (m3_adapt clamps it to
  // lambda_min > 0).
  if (config.trainer.lambda == 0.0 && !HasBalance(config, services::BalanceMethod::kM3Norm) &&
      !HasBalance(config, services::BalanceMethod::kM3Adapt)) {
    return 0;
  }
  const bool rstg = config.trainer.distill_gate == services::DistillGate::kRstg;
  if (config.trainer.distill_loss == services::DistillLoss::kSampledReverseKl) {
    // RSTG's max_prob confidence needs max_v q, i.e. the full distribution;
    // the sampled loss reads its token from the full form too.
    const bool needs_full = rstg && config.rstg.confidence == services::RstgConfidence::kMaxProb;
    return needs_full ? kappa::v1::SCORE_FORM_FULL : kappa::v1::SCORE_FORM_SAMPLED;
  }
  if (config.trainer.distill_loss == services::DistillLoss::kTopkReverseKl ||
      config.trainer.distill_loss == services::DistillLoss::kTopkTailReverseKl) {
    // The loss reads only the teacher's top-k tokens, so the wire and the
    // learner carry just those (k ids + k log-probs per token; the tail
    // bucket is 1 − their mass). RSTG's max_prob confidence reads the top-1, which is among
    // them; token_prob reads q(y_t) of the sampled token, which may lie
    // outside the top-k, so that combination needs the full rows.
    const bool needs_full = rstg && config.rstg.confidence == services::RstgConfidence::kTokenProb;
    return needs_full ? kappa::v1::SCORE_FORM_FULL : kappa::v1::SCORE_FORM_TOPK;
  }
  // reverse_kl and forward_kl read the full distribution.
  return kappa::v1::SCORE_FORM_FULL;
}

}  // namespace

int32_t TeacherFormFor(const services::Config& config) {
  const int32_t form = LogProbFormFor(config);
  // The hidden states carry the full distribution (and so the sampled
  // token's and the top-1's): they replace FULL and SAMPLED rows.
  const bool hidden = config.teacher.rows == services::TeacherRowsForm::kHidden;
  if (hidden && (form == kappa::v1::SCORE_FORM_FULL || form == kappa::v1::SCORE_FORM_SAMPLED)) {
    return kappa::v1::SCORE_FORM_HIDDEN;
  }
  return form;
}

int32_t TeacherTopKFor(const services::Config& config) {
  if (TeacherFormFor(config) != kappa::v1::SCORE_FORM_TOPK) return 0;
  return static_cast<int32_t>(std::max<int64_t>(config.trainer.distill_topk, 0));
}

int32_t TeacherDemonstrationsFor(const services::Config& config) {
  if (config.trainer.distill_gate != services::DistillGate::kRstg || !(config.rstg.sft_weight > 0))
    return 0;
  return static_cast<int32_t>(std::max<int64_t>(config.rstg.teacher_samples, 0));
}

WorkTemplate WorkTemplateFor(const services::Config& config) {
  WorkTemplate work;
  work.group_size = static_cast<int32_t>(config.trainer.group_size);
  work.max_new_tokens = static_cast<int32_t>(config.rollout.max_new_tokens);
  work.temperature = static_cast<float>(config.rollout.temperature);
  work.top_p = static_cast<float>(config.rollout.top_p);
  work.top_k = static_cast<int32_t>(config.rollout.top_k);
  work.min_p = static_cast<float>(config.rollout.min_p);
  work.sampling_seed = services::RlSeed(config);
  work.teacher_form = TeacherFormFor(config);
  work.teacher_top_k = TeacherTopKFor(config);
  work.teacher_demonstrations = TeacherDemonstrationsFor(config);
  work.teacher_temperature = static_cast<float>(config.rstg.teacher_temperature);
  work.teacher_value_dtype = config.trainer.teacher_values == services::Precision::kBFloat16
                                 ? kappa::v1::DTYPE_BFLOAT16
                                 : kappa::v1::DTYPE_FLOAT32;
  work.stop_strings = config.rollout.stop_strings;
  return work;
}

GroupExpectations GroupExpectationsFor(const WorkTemplate& work, int64_t vocab_size) {
  GroupExpectations expect;
  expect.group_size = work.group_size;
  expect.vocab_size = vocab_size;
  expect.max_new_tokens = work.max_new_tokens;
  expect.teacher_form = work.teacher_form;
  expect.teacher_top_k = work.teacher_top_k;
  expect.teacher_demonstrations = work.teacher_demonstrations;
  return expect;
}

}  // namespace kappa::learner
