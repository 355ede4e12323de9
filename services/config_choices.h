// The named choices of the run configuration (services/config.h): each key
// whose value is one of a few names is an enum here, with the spellings the
// YAML uses. The key table (config.cc) parses a spelling into its enum once,
// when the configuration is loaded, and refuses any other text naming the key
// and the allowed spellings; everything after the load reads the enum.
//
// Adding a choice: the enum, its KAPPA_CONFIG_CHOICE line (spellings in the
// order of the enumerators, which must be 0, 1, 2, ...), and a member of
// that type in config.h. Header-only and dependency-free.
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string_view>

namespace kappa::services {

// ConfigChoice<E>::kNames[i]: the spelling of E's value i.
template <typename E>
struct ConfigChoice;

#define KAPPA_CONFIG_CHOICE(Enum, ...)                     \
  template <>                                              \
  struct ConfigChoice<Enum> {                              \
    static constexpr const char* kNames[] = {__VA_ARGS__}; \
  }

// The spelling of `value`.
template <typename E>
std::string_view ChoiceName(E value) {
  return ConfigChoice<E>::kNames[static_cast<size_t>(value)];
}

// The value `text` spells, or nullopt (a command-line flag that takes a
// choice; the configuration's keys are parsed by the key table).
template <typename E>
std::optional<E> ChoiceNamed(std::string_view text) {
  for (size_t i = 0; i < std::size(ConfigChoice<E>::kNames); ++i) {
    if (text == ConfigChoice<E>::kNames[i]) return static_cast<E>(i);
  }
  return std::nullopt;
}

enum class TaskKind { kArithmetic, kJsonl };  // task.kind
KAPPA_CONFIG_CHOICE(TaskKind, "arithmetic", "jsonl");

enum class HeldOutDraw { kFirst, kInterleaved };  // task.heldout_draw
KAPPA_CONFIG_CHOICE(HeldOutDraw, "first", "interleaved");

// student.dtype, teacher.dtype, rollout.weights_dtype: kAuto is bf16 on CUDA,
// fp32 on the CPU (services::ResolveModelDtype).
enum class ModelDtype { kAuto, kFloat32, kBFloat16 };
KAPPA_CONFIG_CHOICE(ModelDtype, "auto", "float32", "bfloat16");

enum class WeightTransport { kGrpc, kC10d, kShm, kAuto };  // rollout.weight_transport
KAPPA_CONFIG_CHOICE(WeightTransport, "grpc", "c10d", "shm", "auto");

enum class Schedule { kConstant, kCosine };  // trainer.lr_schedule, trainer.lambda_schedule
KAPPA_CONFIG_CHOICE(Schedule, "constant", "cosine");

enum class Aggregation { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSum };  // trainer.aggregation
KAPPA_CONFIG_CHOICE(Aggregation, "token-mean", "seq-mean-token-mean", "seq-mean-token-sum");

enum class DistillLoss {  // trainer.distill_loss
  kReverseKl,
  kForwardKl,
  kSampledReverseKl,
  kTopkReverseKl,
  kTopkTailReverseKl,
};
KAPPA_CONFIG_CHOICE(DistillLoss, "reverse_kl", "forward_kl", "sampled_reverse_kl",
                    "topk_reverse_kl", "topk_tail_reverse_kl");

enum class AdvantageStd { kPopulation, kSample };  // trainer.advantage_std
KAPPA_CONFIG_CHOICE(AdvantageStd, "population", "sample");

enum class TruncatedResponses { kKeep, kMask, kZeroReward };  // trainer.truncated
KAPPA_CONFIG_CHOICE(TruncatedResponses, "keep", "mask", "zero_reward");

// teacher.rows: the teacher's rows as log-probs in the form the loss reads
// (full, top-k or sampled), or as its final hidden states.
enum class TeacherRowsForm { kLogprobs, kHidden };
KAPPA_CONFIG_CHOICE(TeacherRowsForm, "logprobs", "hidden");

enum class Precision { kFloat32, kBFloat16 };  // trainer.precision, trainer.teacher_values
KAPPA_CONFIG_CHOICE(Precision, "fp32", "bf16");

enum class DistillGate { kNone, kAll, kRstg };  // trainer.distill_gate
KAPPA_CONFIG_CHOICE(DistillGate, "none", "all", "rstg");

enum class BalanceMethod { kNaive, kM3Norm, kM3Mask, kM3Project, kM3Adapt };  // trainer.balance
KAPPA_CONFIG_CHOICE(BalanceMethod, "naive", "m3_norm", "m3_mask", "m3_project", "m3_adapt");

enum class MaskTarget { kReward, kDistill };  // m3.mask_target
KAPPA_CONFIG_CHOICE(MaskTarget, "reward", "distill");

// m3.mask_estimator, monitor.kdr_estimator: the cheap K_DR estimators (the
// exact one runs on sampled positions, monitor.kdr_exact_every).
enum class KdrEstimator { kLastLayer, kLogit };
KAPPA_CONFIG_CHOICE(KdrEstimator, "last_layer", "logit");

enum class RstgConfidence { kMaxProb, kTokenProb };  // rstg.confidence
KAPPA_CONFIG_CHOICE(RstgConfidence, "max_prob", "token_prob");

enum class RstgTokenSelector { kEntropy, kDivergence, kUnion };  // rstg.token_selector
KAPPA_CONFIG_CHOICE(RstgTokenSelector, "entropy", "divergence", "union");

// learner.shard: what the data-parallel ranks split instead of each holding
// it whole (ZeRO's stages 1 and 2: AdamW's state, then the gradients too).
enum class LearnerShard { kNone, kOptimizer, kGradients };
KAPPA_CONFIG_CHOICE(LearnerShard, "none", "optimizer", "gradients");

#undef KAPPA_CONFIG_CHOICE

}  // namespace kappa::services
