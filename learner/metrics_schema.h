// The metrics.jsonl schema: the keys of the one JSON object the learner
// writes per step (learner/step_record.h builds it) and that `kappa
// progress`, `kappa report` and `kappa experiment` read. docs/metrics.md
// says what each means; a test checks the learner writes no key outside
// kAllKeys and that the document names every one.
//
// Header only, no dependencies: cli/ reads these without linking the learner.
#pragma once

namespace kappa::metrics_jsonl {

// The step and when it ran.
inline constexpr char kStep[] = "step";  // 0: the held-out evaluation before training
inline constexpr char kPolicyVersion[] = "policy_version";
inline constexpr char kStepSeconds[] = "step_seconds";
inline constexpr char kElapsedSeconds[] = "elapsed_seconds";
inline constexpr char kSamplesPerSecond[] = "samples_per_second";

// The batch: rollouts, staleness and the coordinator's counters.
inline constexpr char kRewardMean[] = "reward_mean";
inline constexpr char kTruncatedFraction[] = "truncated_fraction";
inline constexpr char kSamples[] = "samples";
inline constexpr char kTokens[] = "tokens";
inline constexpr char kStalenessMean[] = "staleness_mean";
inline constexpr char kGroupsAccepted[] = "groups_accepted";
inline constexpr char kGroupsConsumed[] = "groups_consumed";
inline constexpr char kGroupsDroppedStale[] = "groups_dropped_stale";
inline constexpr char kGroupsDroppedDuplicate[] = "groups_dropped_duplicate";
inline constexpr char kGroupsDroppedUnknownLease[] = "groups_dropped_unknown_lease";
inline constexpr char kLeasesReissued[] = "leases_reissued";
inline constexpr char kBufferGroups[] = "buffer_groups";
inline constexpr char kLeaseIds[] = "lease_ids";
inline constexpr char kGroupVersions[] = "group_versions";

// The losses and the optimizer.
inline constexpr char kLossReward[] = "loss_reward";
inline constexpr char kLossDistill[] = "loss_distill";
inline constexpr char kLossSft[] = "loss_sft";
inline constexpr char kEntropy[] = "entropy";
inline constexpr char kClipFraction[] = "clip_fraction";
inline constexpr char kApproxKl[] = "approx_kl";
inline constexpr char kGradNorm[] = "grad_norm";
inline constexpr char kLr[] = "lr";

// κ and the balancing.
inline constexpr char kLambda[] = "lambda";
inline constexpr char kDistillScale[] = "distill_scale";
inline constexpr char kKappa[] = "kappa";
inline constexpr char kKappaEffective[] = "kappa_effective";
inline constexpr char kGradNormReward[] = "grad_norm_reward";
inline constexpr char kGradNormDistill[] = "grad_norm_distill";
inline constexpr char kGradCosine[] = "grad_cosine";
inline constexpr char kGradNormRewardBalanced[] = "grad_norm_reward_balanced";
inline constexpr char kProjected[] = "projected";
inline constexpr char kM3MaskedPositions[] = "m3_masked_positions";

// K_DR: the cheap estimator's statistics (kdr_*) and the exact one's on
// sampled positions (kdr_exact_*).
inline constexpr char kKdrPositions[] = "kdr_positions";
inline constexpr char kKdrMean[] = "kdr_mean";
inline constexpr char kKdrNegativeFraction[] = "kdr_negative_fraction";
inline constexpr char kKdrNegativeWeightedFraction[] = "kdr_negative_weighted_fraction";
inline constexpr char kKdrQuantiles[] = "kdr_quantiles";
inline constexpr char kKdrPositionMean[] = "kdr_position_mean";
inline constexpr char kKdrExactPositions[] = "kdr_exact_positions";
inline constexpr char kKdrExactMean[] = "kdr_exact_mean";
inline constexpr char kKdrExactNegativeFraction[] = "kdr_exact_negative_fraction";
inline constexpr char kKdrExactNegativeWeightedFraction[] = "kdr_exact_negative_weighted_fraction";
inline constexpr char kKdrExactQuantiles[] = "kdr_exact_quantiles";
inline constexpr char kKdrExactSeconds[] = "kdr_exact_seconds";
inline constexpr char kKdrSignAgreementLogit[] = "kdr_sign_agreement_logit";
inline constexpr char kKdrSignAgreementLastLayer[] = "kdr_sign_agreement_last_layer";

// The distillation gate and demonstrations.
inline constexpr char kDistillPositions[] = "distill_positions";
inline constexpr char kRstgGatedGroups[] = "rstg_gated_groups";
inline constexpr char kDemonstrations[] = "demonstrations";

// The teacher rows: top-k rows' mass outside the k ids (null for other
// rows) and the bytes the batch's rows held.
inline constexpr char kTeacherTailMassMean[] = "teacher_tail_mass_mean";
inline constexpr char kTeacherTailMassP95[] = "teacher_tail_mass_p95";
inline constexpr char kTeacherBytes[] = "teacher_bytes";

// The training–inference mismatch on the step's on-policy tokens (null
// when none): mean |log π_learner − log π_behaviour|, mean k3, the count.
inline constexpr char kMismatchAbsMean[] = "mismatch_abs_mean";
inline constexpr char kMismatchK3[] = "mismatch_k3";
inline constexpr char kMismatchTokens[] = "mismatch_tokens";

// Alarms and evaluation.
inline constexpr char kAlarms[] = "alarms";  // [{kind, step, message, values}], when any fired
inline constexpr char kAlarmActive[] = "alarm_active";    // {kind: 0|1}
inline constexpr char kEvalAccuracy[] = "eval_accuracy";  // on eval steps only

// With teacher.bootstrap.corrupt only: {subset: value} for the rule's subset
// and "rest" (values null where the subset had no position).
inline constexpr char kKdrMeanBySubset[] = "kdr_mean_by_subset";
inline constexpr char kKdrNegativeFractionBySubset[] = "kdr_negative_fraction_by_subset";
inline constexpr char kKdrPositionsBySubset[] = "kdr_positions_by_subset";
inline constexpr char kKdrTokenMeanBySubset[] =
    "kdr_token_mean_by_subset";  // {subset: [per response token]}
inline constexpr char kEvalAccuracyBySubset[] = "eval_accuracy_by_subset";  // on eval steps

inline constexpr const char* kAllKeys[] = {
    kStep,
    kPolicyVersion,
    kStepSeconds,
    kElapsedSeconds,
    kSamplesPerSecond,
    kRewardMean,
    kTruncatedFraction,
    kSamples,
    kTokens,
    kStalenessMean,
    kGroupsAccepted,
    kGroupsConsumed,
    kGroupsDroppedStale,
    kGroupsDroppedDuplicate,
    kGroupsDroppedUnknownLease,
    kLeasesReissued,
    kBufferGroups,
    kLeaseIds,
    kGroupVersions,
    kLossReward,
    kLossDistill,
    kLossSft,
    kEntropy,
    kClipFraction,
    kApproxKl,
    kGradNorm,
    kLr,
    kLambda,
    kDistillScale,
    kKappa,
    kKappaEffective,
    kGradNormReward,
    kGradNormDistill,
    kGradCosine,
    kGradNormRewardBalanced,
    kProjected,
    kM3MaskedPositions,
    kKdrPositions,
    kKdrMean,
    kKdrNegativeFraction,
    kKdrNegativeWeightedFraction,
    kKdrQuantiles,
    kKdrPositionMean,
    kKdrExactPositions,
    kKdrExactMean,
    kKdrExactNegativeFraction,
    kKdrExactNegativeWeightedFraction,
    kKdrExactQuantiles,
    kKdrExactSeconds,
    kKdrSignAgreementLogit,
    kKdrSignAgreementLastLayer,
    kDistillPositions,
    kRstgGatedGroups,
    kDemonstrations,
    kTeacherTailMassMean,
    kTeacherTailMassP95,
    kTeacherBytes,
    kMismatchAbsMean,
    kMismatchK3,
    kMismatchTokens,
    kAlarms,
    kAlarmActive,
    kEvalAccuracy,
    kKdrMeanBySubset,
    kKdrNegativeFractionBySubset,
    kKdrPositionsBySubset,
    kKdrTokenMeanBySubset,
    kEvalAccuracyBySubset,
};

}  // namespace kappa::metrics_jsonl
