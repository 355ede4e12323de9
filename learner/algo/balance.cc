#include "learner/algo/balance.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

namespace kappa::learner {
namespace {

// Guards ‖g_D‖ = 0 (no distillation signal in the batch) in m3_norm.
constexpr double kNormEpsilon = 1e-12;

// Float64 sums go over chunks of this many elements: float64 accuracy
// without a float64 copy of a whole gradient (190 MB for 24M parameters,
// which made κ's norms cost more than the backward pass they measure on a CPU).
constexpr int64_t kFloat64Chunk = int64_t{1} << 20;

torch::Tensor SquaredNorm(const GradientList& a, const torch::Device& device) {
  torch::Tensor sum = torch::zeros({}, torch::TensorOptions(device).dtype(torch::kFloat64));
  for (const torch::Tensor& g : a) {
    if (g.defined()) sum = sum + DotInFloat64(g, g);
  }
  return sum;
}

// [‖a‖², ‖b‖², ⟨a, b⟩] over the lists, in float64: one pass where both
// are defined, so each chunk of each gradient is converted once.
torch::Tensor GramOf(const GradientList& a, const GradientList& b, const torch::Device& device) {
  torch::Tensor sums = torch::zeros({3}, torch::TensorOptions(device).dtype(torch::kFloat64));
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const bool has_a = i < a.size() && a[i].defined(), has_b = i < b.size() && b[i].defined();
    if (has_a && has_b) {
      sums += GramInFloat64(a[i], b[i]);
    } else if (has_a) {
      sums[0] += DotInFloat64(a[i], a[i]);
    } else if (has_b) {
      sums[1] += DotInFloat64(b[i], b[i]);
    }
  }
  return sums;
}

// a += scale · b, per parameter (scale a device scalar, so no host sync;
// addcmul_ broadcasts it without a temporary the size of b).
void AddScaled(GradientList& a, const GradientList& b, const torch::Tensor& scale) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!b[i].defined()) continue;
    const torch::Tensor s = scale.to(b[i].scalar_type());
    a[i] = a[i].defined() ? a[i].addcmul_(b[i], s) : b[i] * s;
  }
}

}  // namespace

torch::Tensor DotInFloat64(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.reshape({-1}), y = b.reshape({-1});
  if (x.numel() != y.numel()) throw std::invalid_argument("DotInFloat64: sizes differ");
  const bool same = a.is_same(b);
  torch::Tensor sum = torch::zeros({}, x.options().dtype(torch::kFloat64));
  for (int64_t start = 0; start < x.numel(); start += kFloat64Chunk) {
    const int64_t length = std::min(kFloat64Chunk, x.numel() - start);
    const torch::Tensor x64 = x.narrow(0, start, length).to(torch::kFloat64);
    sum += torch::dot(x64, same ? x64 : y.narrow(0, start, length).to(torch::kFloat64));
  }
  return sum;
}

torch::Tensor GramInFloat64(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.reshape({-1}), y = b.reshape({-1});
  if (x.numel() != y.numel()) throw std::invalid_argument("GramInFloat64: sizes differ");
  torch::Tensor sums = torch::zeros({3}, x.options().dtype(torch::kFloat64));
  for (int64_t start = 0; start < x.numel(); start += kFloat64Chunk) {
    const int64_t length = std::min(kFloat64Chunk, x.numel() - start);
    const torch::Tensor x64 = x.narrow(0, start, length).to(torch::kFloat64);
    const torch::Tensor y64 = y.narrow(0, start, length).to(torch::kFloat64);
    sums += torch::stack({torch::dot(x64, x64), torch::dot(y64, y64), torch::dot(x64, y64)});
  }
  return sums;
}

BalanceConfig ParseBalance(const std::vector<std::string>& methods) {
  BalanceConfig config;
  std::set<std::string> seen;
  for (const std::string& name : methods) {
    if (!seen.insert(name).second) {
      throw std::invalid_argument("balance: '" + name + "' listed twice");
    }
    if (name == "naive") continue;
    if (name == "m3_norm") config.normalize = true;
    else if (name == "m3_mask") config.mask = true;
    else if (name == "m3_project") config.project = true;
    else if (name == "m3_adapt") config.adapt = true;
    else {
      throw std::invalid_argument("balance: unknown method '" + name +
                                  "' (allowed: naive, m3_norm, m3_mask, m3_project, m3_adapt)");
    }
  }
  if (seen.count("naive") && seen.size() > 1) {
    throw std::invalid_argument("balance: 'naive' cannot be combined with M3 methods");
  }
  if (config.normalize && config.adapt) {
    throw std::invalid_argument(
        "balance: m3_norm and m3_adapt both set the scale of the distillation gradient; pick one");
  }
  return config;
}

GradientPlan BalanceConfig::Plan(double reward_weight, double lambda, double sft_weight) const {
  GradientPlan plan;
  plan.reward_weight = reward_weight;
  plan.distill_weight = lambda;
  plan.sft_weight = sft_weight;
  plan.balance = *this;
  return plan;
}

std::string BalanceName(const BalanceConfig& config) {
  std::string name;
  auto add = [&](bool on, const char* part) {
    if (!on) return;
    if (!name.empty()) name += "+";
    name += part;
  };
  add(config.normalize, "m3_norm");
  add(config.mask, "m3_mask");
  add(config.project, "m3_project");
  add(config.adapt, "m3_adapt");
  return name.empty() ? "naive" : name;
}

BalanceConfig::MaskTarget ParseMaskTarget(const std::string& name) {
  if (name == "reward") return BalanceConfig::MaskTarget::kReward;
  if (name == "distill") return BalanceConfig::MaskTarget::kDistill;
  throw std::invalid_argument("m3.mask_target must be 'reward' or 'distill', got '" + name + "'");
}

torch::Tensor ConflictMaskWeights(const torch::Tensor& kernel, double temperature) {
  const torch::Tensor k = kernel.detach();
  const torch::Tensor kept = temperature > 0 ? torch::sigmoid(k / temperature) : torch::zeros_like(k);
  return torch::where(k < 0, kept, torch::ones_like(k));
}

CombinedGradient CombineGradients(GradientList reward, GradientList distill, GradientList sft,
                                  const GradientPlan& plan, const torch::Device& device,
                                  const PartialSumReducer& sum_over_shards) {
  // A partial sum over this rank's elements, made the whole gradient's.
  auto whole = [&](torch::Tensor partial) {
    if (sum_over_shards) sum_over_shards(partial);
    return partial;
  };
  CombinedGradient out;
  const auto f64 = torch::TensorOptions(device).dtype(torch::kFloat64);
  if (plan.reward_weight != 1.0) {
    for (torch::Tensor& g : reward) {
      if (g.defined()) g.mul_(plan.reward_weight);
    }
  }
  const torch::Tensor gram = whole(GramOf(reward, distill, device));
  out.reward_sq = gram[0];
  out.distill_sq = gram[1];
  out.dot = gram[2];

  if (plan.balance.project) {
    // min(⟨g_R,g_D⟩, 0) / ‖g_D‖²: zero when there is no conflict, so the
    // subtraction below leaves g_R bit-for-bit unchanged.
    const torch::Tensor coefficient =
        torch::where(out.distill_sq > 0, out.dot.clamp_max(0) / out.distill_sq.clamp_min(kNormEpsilon),
                     torch::zeros({}, f64));
    AddScaled(reward, distill, -coefficient);
    out.balanced_reward_sq = whole(SquaredNorm(reward, device));
  } else {
    out.balanced_reward_sq = out.reward_sq;
  }

  const torch::Tensor lambda = torch::full({}, plan.distill_weight, f64);
  if (plan.balance.normalize) {
    // s = λ ‖g_R′‖ / (κ_target ‖g_D‖): κ_eff = κ_target / λ, so λ keeps its
    // meaning as the distillation's relative weight. ‖g_R′‖ = 0 (every group
    // tied, so every advantage 0, or w_R = 0): no magnitude to match, and
    // s = 0 would drop the distillation exactly on the steps it alone can
    // carry; s keeps λ there.
    const torch::Tensor normalized =
        lambda * out.balanced_reward_sq.sqrt() /
        (plan.balance.kappa_target * out.distill_sq.sqrt() + kNormEpsilon);
    out.distill_scale = torch::where(out.balanced_reward_sq > 0, normalized, lambda);
  } else {
    out.distill_scale = lambda;
  }

  out.total = std::move(reward);
  AddScaled(out.total, distill, out.distill_scale);
  if (plan.sft_weight != 0.0) AddScaled(out.total, sft, torch::full({}, plan.sft_weight, f64));
  out.total_sq = whole(SquaredNorm(out.total, device));
  return out;
}

LambdaController::LambdaController(double initial_lambda, double kappa_target,
                                   LambdaControllerConfig config)
    : lambda_(initial_lambda), kappa_target_(kappa_target), config_(config) {
  if (!(config_.lambda_min > 0) || !(config_.lambda_max >= config_.lambda_min) ||
      !(config_.max_factor >= 1) || !(config_.ema > 0 && config_.ema <= 1) ||
      !(kappa_target_ > 0)) {
    throw std::invalid_argument(
        "m3_adapt: need 0 < lambda_min <= lambda_max, adapt_max_factor >= 1, "
        "0 < adapt_ema <= 1 and kappa_target > 0");
  }
  lambda_ = std::clamp(lambda_, config_.lambda_min, config_.lambda_max);
}

void LambdaController::Update(double reward_grad_norm, double distill_grad_norm) {
  if (!(distill_grad_norm > 0) || !std::isfinite(reward_grad_norm)) return;
  const double kappa_effective = reward_grad_norm / (lambda_ * distill_grad_norm);
  kappa_ema_ = kappa_ema_ ? (1 - config_.ema) * *kappa_ema_ + config_.ema * kappa_effective
                          : kappa_effective;
  if (!(*kappa_ema_ > 0)) return;  // no reward signal yet: nothing to balance
  const double factor = std::clamp(std::pow(*kappa_ema_ / kappa_target_, config_.gain),
                                   1.0 / config_.max_factor, config_.max_factor);
  lambda_ = std::clamp(lambda_ * factor, config_.lambda_min, config_.lambda_max);
}

void LambdaController::Restore(const LambdaControllerState& state) {
  if (!std::isfinite(state.lambda) || !(state.lambda > 0)) {
    throw std::invalid_argument("m3_adapt state: lambda must be finite and > 0, got " +
                                std::to_string(state.lambda));
  }
  if (state.kappa_ema && !std::isfinite(*state.kappa_ema)) {
    throw std::invalid_argument("m3_adapt state: kappa_ema must be finite, got " +
                                std::to_string(*state.kappa_ema));
  }
  lambda_ = std::clamp(state.lambda, config_.lambda_min, config_.lambda_max);
  kappa_ema_ = state.kappa_ema;
}

}  // namespace kappa::learner
