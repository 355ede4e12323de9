#include "learner/algo/distill_gate.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "learner/algo/logprob_losses.h"

namespace kappa::learner {

DistillGate ParseDistillGate(const std::string& name) {
  if (name == "none") return DistillGate::kNone;
  if (name == "all") return DistillGate::kAll;
  if (name == "rstg") return DistillGate::kRstg;
  throw std::invalid_argument("trainer.distill_gate must be none, all or rstg, got '" + name + "'");
}

const char* DistillGateName(DistillGate gate) {
  switch (gate) {
    case DistillGate::kNone: return "none";
    case DistillGate::kAll: return "all";
    case DistillGate::kRstg: return "rstg";
  }
  return "unknown";
}

RstgConfig::Confidence ParseRstgConfidence(const std::string& name) {
  if (name == "max_prob") return RstgConfig::Confidence::kMaxProb;
  if (name == "token_prob") return RstgConfig::Confidence::kTokenProb;
  throw std::invalid_argument("rstg.confidence must be max_prob or token_prob, got '" + name + "'");
}

RstgConfig::TokenScore ParseRstgTokenScore(const std::string& name) {
  if (name == "entropy") return RstgConfig::TokenScore::kEntropy;
  if (name == "divergence") return RstgConfig::TokenScore::kDivergence;
  if (name == "union") return RstgConfig::TokenScore::kUnion;
  throw std::invalid_argument("rstg.token_selector must be entropy, divergence or union, got '" +
                              name + "'");
}

void CheckRstgConfig(const RstgConfig& config) {
  if (!(config.token_frac > 0 && config.token_frac <= 1)) {
    throw std::invalid_argument("rstg.token_frac must be in (0, 1]");
  }
  if (config.token_score == RstgConfig::TokenScore::kUnion && config.threshold >= 0) {
    throw std::invalid_argument(
        "rstg.entropy_threshold / rstg.divergence_threshold compare one score; "
        "rstg.token_selector=union ranks entropy and divergence apart by rstg.token_frac");
  }
}

namespace {

// 1 at the ceil(frac · #gated) gated positions of highest `score`, else 0.
torch::Tensor TopFraction(const torch::Tensor& score, const torch::Tensor& gated, double frac) {
  const int64_t candidates = static_cast<int64_t>(gated.sum().item<double>());
  const int64_t keep =
      static_cast<int64_t>(std::ceil(frac * static_cast<double>(candidates) - 1e-9));
  torch::Tensor selected = torch::zeros_like(gated);
  if (keep > 0) {
    // Ungated positions score -inf so topk never picks them.
    const torch::Tensor ranked =
        score.detach()
            .to(torch::kFloat32)
            .masked_fill(gated == 0, -std::numeric_limits<float>::infinity());
    const torch::Tensor top = std::get<1>(ranked.flatten().topk(keep));
    selected.view({-1}).index_fill_(0, top, 1.0);
  }
  return selected;
}

// The gated positions the token level keeps.
torch::Tensor SelectTokens(const torch::Tensor& gated, const torch::Tensor& entropy,
                           const torch::Tensor& divergence, const RstgConfig& config) {
  using TokenScore = RstgConfig::TokenScore;
  CheckRstgConfig(config);
  if (config.token_score == TokenScore::kUnion) {
    return torch::maximum(TopFraction(entropy, gated, config.token_frac),
                          TopFraction(divergence, gated, config.token_frac));
  }
  const torch::Tensor& score = config.token_score == TokenScore::kEntropy ? entropy : divergence;
  if (config.threshold >= 0) {
    return gated * (score.detach() >= config.threshold).to(torch::kFloat32);
  }
  return TopFraction(score, gated, config.token_frac);
}

}  // namespace

DistillSelection SelectAll(const torch::Tensor& response_mask) {
  DistillSelection out;
  out.selected = response_mask.to(torch::kFloat32);
  out.weights = out.selected;
  out.selected_positions = static_cast<int64_t>(out.selected.sum().item<double>());
  return out;
}

DistillSelection RstgSelect(const torch::Tensor& rewards, const torch::Tensor& response_mask,
                            const TeacherRows& teacher, const torch::Tensor& target_tokens,
                            const torch::Tensor& entropy, const torch::Tensor& divergence,
                            const RstgConfig& config) {
  torch::NoGradGuard no_grad;
  if (!(config.token_frac > 0 && config.token_frac <= 1) && config.threshold < 0) {
    throw std::invalid_argument("rstg.token_frac must be in (0, 1]");
  }
  const int64_t group_size = rewards.size(1);
  const torch::Tensor mask = response_mask.to(torch::kFloat32);

  // Sample level: negative zero-variance groups (every reward 0).
  const torch::Tensor negative_group = (rewards <= 0).all(1);  // [num_groups]
  const torch::Tensor row_gated =
      negative_group.repeat_interleave(group_size).to(mask.device()).to(torch::kFloat32);
  torch::Tensor gated = mask * row_gated.unsqueeze(1);

  // Teacher confidence per sample, averaged over its response positions.
  const bool full = teacher.full(target_tokens);
  torch::Tensor per_position;
  if (config.confidence == RstgConfig::Confidence::kMaxProb) {
    if (!full && !teacher.topk()) {
      throw std::invalid_argument(
          "rstg.confidence=max_prob needs full-vocabulary, top-k or hidden teacher rows; use "
          "token_prob");
    }
    per_position = teacher.MaxLogProb().exp();
  } else {
    if (teacher.topk()) {
      throw std::invalid_argument(
          "rstg.confidence=token_prob needs q(y_t) of the sampled token, which top-k teacher "
          "rows may not hold; use max_prob or full rows");
    }
    per_position = teacher.TargetLogProbs(target_tokens);
  }
  const torch::Tensor length = mask.sum(1).clamp_min(1);
  torch::Tensor confidence = (per_position * mask).sum(1) / length;  // mean over positions
  if (config.confidence == RstgConfig::Confidence::kTokenProb) confidence = confidence.exp();

  // Token level, among the gated positions.
  const torch::Tensor selected = SelectTokens(gated, entropy, divergence, config);

  DistillSelection out;
  out.selected = selected;
  out.weights = selected * confidence.unsqueeze(1).to(torch::kFloat32);
  out.gated_groups = negative_group.sum().item<int64_t>();
  out.selected_positions = static_cast<int64_t>(selected.sum().item<double>());
  return out;
}

}  // namespace kappa::learner
