// Which positions the distillation term trains on (docs/algorithms.md §5, RSTG):
//   none  no distillation (GRPO only)
//   all   every response position (naive hybrid)
//   rstg  sample level: only groups whose G rewards are all 0 ("negative
//         zero-variance": GRPO has no gradient there), each sample weighted by
//         the teacher's confidence; token level: within those, only positions
//         whose student entropy, divergence ℓ_D, or either (the union: the
//         seed's "high entropy or large teacher-student divergence") is in
//         the top token_frac of the gated positions, or above an absolute
//         threshold.
// Groups with reward variance keep plain GRPO in every mode.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "learner/algo/losses.h"

namespace kappa::learner {

enum class DistillGate { kNone, kAll, kRstg };
DistillGate ParseDistillGate(const std::string& name);  // none | all | rstg
const char* DistillGateName(DistillGate gate);

struct RstgConfig {
  enum class Confidence { kMaxProb, kTokenProb };
  // kUnion: the top token_frac by entropy ∪ the top token_frac by
  // divergence, each ranked among the gated positions on its own scale.
  enum class TokenScore { kEntropy, kDivergence, kUnion };

  // kMaxProb: c_i = mean_t max_v q_{i,t}(v) (needs full teacher rows);
  // kTokenProb: c_i = exp(mean_t log q_{i,t}(y_t)).
  Confidence confidence = Confidence::kMaxProb;
  TokenScore token_score = TokenScore::kEntropy;
  double token_frac = 0.5;  // keep ceil(frac · #gated positions) top-scoring ones
  // >= 0: keep positions whose score is at least this instead of token_frac
  // (one score's scale: refused with kUnion).
  double threshold = -1.0;
};

// Throws std::invalid_argument for settings that contradict each other: a
// threshold with kUnion (a threshold compares one score; union ranks both
// by token_frac), token_frac outside (0, 1].
void CheckRstgConfig(const RstgConfig& config);

RstgConfig::Confidence ParseRstgConfidence(const std::string& name);  // max_prob | token_prob
// entropy | divergence | union
RstgConfig::TokenScore ParseRstgTokenScore(const std::string& name);

struct DistillSelection {
  torch::Tensor selected;  // [B, T] float 0/1: positions the distillation term trains on
  torch::Tensor weights;   // [B, T] float: per-position weight (c_i or 1) where selected, else 0
  int64_t gated_groups = 0;
  int64_t selected_positions = 0;
};

// Every response position, weight 1 (gate `all`).
DistillSelection SelectAll(const torch::Tensor& response_mask);

// RSTG. rewards [num_groups, G] (row b of the batch is group b / G, sample
// b % G); response_mask, entropy, divergence: [B, T]; teacher: full, top-k
// or sampled rows; target_tokens [B, T]. max_prob reads the top-1 of full or
// top-k rows; token_prob reads q(y_t) of full or sampled rows. Throws
// std::invalid_argument for the other pairs (max_prob with sampled rows,
// token_prob with top-k rows, which may not hold y_t) and for a threshold
// with the union selector.
DistillSelection RstgSelect(const torch::Tensor& rewards, const torch::Tensor& response_mask,
                            const TeacherRows& teacher, const torch::Tensor& target_tokens,
                            const torch::Tensor& entropy, const torch::Tensor& divergence,
                            const RstgConfig& config);

}  // namespace kappa::learner
