// M3 balancing of the two gradients (docs/algorithms.md §4): magnitude normalization
// plus one strategy per failure mechanism, selectable and combinable.
//   m3_mask     token level: drop one term where K_DR(n) < 0 (before backward)
//   m3_project  direction: remove the part of g_R that opposes g_D
//   m3_norm     magnitude: scale g_D so ‖g_R‖ / ‖s g_D‖ = κ_target / λ (s = λ when g_R = 0)
//   m3_adapt    schedule: a bounded controller on λ holding κ_eff's EMA at κ_target
// Order within a step: mask (loss level), project, then norm or λ.
#pragma once

#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "learner/algo/cross_kernel.h"

namespace kappa::learner {

struct LambdaControllerConfig {
  double gain = 0.5;        // exponent on (κ_eff EMA / κ_target)
  double ema = 0.1;         // EMA coefficient of κ_eff
  double max_factor = 1.1;  // per-step change of λ within [1/f, f]
  double lambda_min = 1e-3;
  double lambda_max = 1e3;
};

struct GradientPlan;

struct BalanceConfig {
  enum class MaskTarget { kReward, kDistill };

  bool mask = false;
  bool project = false;
  bool normalize = false;
  bool adapt = false;
  double kappa_target = 1.0;
  MaskTarget mask_target = MaskTarget::kReward;
  KdrEstimator mask_estimator = KdrEstimator::kLogit;  // logit | last_layer
  double mask_temperature = 0.0;                       // 0: hard; τ > 0: σ(K/τ)
  LambdaControllerConfig adapt_config;

  // Whether the step needs ∇L_R and ∇L_D apart (anything but plain sums).
  bool NeedsSeparateGradients() const { return project || normalize || adapt; }

  // The combination g = w_R g_R′ + s g_D + μ g_SFT this balancing makes of a
  // step's gradients, with s = λ unless m3_norm sets it.
  GradientPlan Plan(double reward_weight, double lambda, double sft_weight) const;
};

// From the `trainer.balance` list: ["naive"] or any of m3_norm, m3_mask,
// m3_project, m3_adapt. Throws std::invalid_argument on unknown names,
// duplicates, "naive" with others, and m3_norm with m3_adapt (both set the
// scale of g_D). The remaining fields keep their defaults.
BalanceConfig ParseBalance(const std::vector<std::string>& methods);
std::string BalanceName(const BalanceConfig& config);  // "naive", "m3_norm+m3_project", ...
BalanceConfig::MaskTarget ParseMaskTarget(const std::string& name);  // reward | distill

// m3_mask weights for the masked term, [B, T]: 1 where K ≥ 0; where K < 0,
// 0 (hard) or σ(K/τ) (soft, τ = mask_temperature > 0).
torch::Tensor ConflictMaskWeights(const torch::Tensor& kernel, double temperature);

// One gradient per trainable parameter; undefined = no gradient.
using GradientList = std::vector<torch::Tensor>;

// How one step combines its gradients (CombineGradients); made by
// BalanceConfig::Plan.
struct GradientPlan {
  double reward_weight = 1.0;   // w_R on ∇L_R (0: distillation only)
  double distill_weight = 1.0;  // λ (under balance.normalize: the target ratio's λ)
  double sft_weight = 0.0;      // μ on ∇L_SFT
  BalanceConfig balance;        // read: project, normalize, kappa_target
};

// Σ a·b over all elements, accumulated in float64 (a 0-dim float64 tensor on
// their device, no host sync); a and b may be the same tensor (‖a‖²).
torch::Tensor DotInFloat64(const torch::Tensor& a, const torch::Tensor& b);
// [‖a‖², ‖b‖², ⟨a, b⟩] in one pass, the same way: float64 [3] on their device.
torch::Tensor GramInFloat64(const torch::Tensor& a, const torch::Tensor& b);

// What CombineGradients did, as device scalars (one host sync for the step).
struct CombinedGradient {
  GradientList total;           // g = g_R′ + s g_D + μ g_SFT
  torch::Tensor reward_sq;      // ‖w_R ∇L_R‖² before projection
  torch::Tensor distill_sq;     // ‖∇L_D‖²
  torch::Tensor dot;            // ⟨w_R ∇L_R, ∇L_D⟩ before projection
  torch::Tensor balanced_reward_sq;  // ‖g_R′‖² after projection
  torch::Tensor distill_scale;  // s: λ, or λ ‖g_R′‖ / (κ_target ‖∇L_D‖ + ε) under m3_norm
                                // (λ again when ‖g_R′‖ = 0)
  torch::Tensor total_sq;       // ‖g‖²
};

// Combines the per-signal gradients per `plan`; consumes (modifies) its
// inputs. m3_project: if ⟨g_R, g_D⟩ < 0, g_R′ = g_R − (⟨g_R,g_D⟩/‖g_D‖²) g_D,
// so ⟨g_R′, g_D⟩ = 0; otherwise g_R′ = g_R exactly. m3_norm: s chosen so
// ‖g_R′‖ / ‖s g_D‖ = κ_target / λ; when ‖g_R′‖ = 0 (all advantages 0, or
// w_R = 0) there is nothing to match and s = λ (plan.distill_weight), so such
// a step still distils. Stays on the gradients' device.
//
// Sharded (learner.shard: gradients): the lists hold this rank's shard of
// each gradient, and `sum_over_shards`, given every float64 partial sum
// (the Gram [‖g_R‖², ‖g_D‖², ⟨g_R, g_D⟩], ‖g_R′‖², ‖g‖²) before anything
// reads it, sums it over the ranks in place; every global quantity is then
// the whole gradient's, and each rank combines its shard. Empty: one
// process holding whole gradients. REQUIRES (sharded): every rank calls
// with the same plan (the sums are collectives, three at most).
using PartialSumReducer = std::function<void(torch::Tensor&)>;
CombinedGradient CombineGradients(GradientList reward, GradientList distill, GradientList sft,
                                  const GradientPlan& plan, const torch::Device& device,
                                  const PartialSumReducer& sum_over_shards = {});

// What LambdaController carries from step to step: what a checkpoint saves
// so a resumed run continues with the same λ.
struct LambdaControllerState {
  double lambda = 1.0;
  std::optional<double> kappa_ema;  // absent: no measurement yet
};

// m3_adapt: λ ← clamp(λ · clamp((EMA κ_eff / κ_target)^gain, 1/f, f), λ_min, λ_max)
// with κ_eff = ‖g_R‖ / (λ ‖g_D‖), the ratio the update actually applied.
class LambdaController {
 public:
  LambdaController(double initial_lambda, double kappa_target, LambdaControllerConfig config);

  double lambda() const { return lambda_; }
  std::optional<double> kappa_ema() const { return kappa_ema_; }
  // One measurement under the current λ; steps with ‖g_D‖ = 0 are skipped.
  void Update(double reward_grad_norm, double distill_grad_norm);

  LambdaControllerState state() const { return {lambda_, kappa_ema_}; }
  // Continues from `state` (a checkpoint's): λ clamped to this config's
  // [lambda_min, lambda_max]. Throws std::invalid_argument naming the field
  // for a λ that is not finite and > 0 or a non-finite κ EMA.
  void Restore(const LambdaControllerState& state);

 private:
  double lambda_;
  const double kappa_target_;
  const LambdaControllerConfig config_;
  std::optional<double> kappa_ema_;
};

}  // namespace kappa::learner
