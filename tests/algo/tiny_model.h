// A small decoder and a scored batch for the training-path tests.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <vector>

#include "learner/algo/train_batch.h"
#include "model/model_config.h"
#include "model/transformer.h"

namespace kappa::learner::testing {

inline model::ModelConfig TinyConfig() {
  model::ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  return c;
}

// Weights scaled up from the N(0, 0.02) init so logits are far from uniform
// and every gradient term is non-trivial.
inline model::Decoder TinyModel(uint64_t seed) {
  torch::manual_seed(seed);
  model::Decoder m(TinyConfig());
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) {
    if (p.dim() == 2) p.mul_(25.0);
  }
  return m;
}

// Groups of G samples with random responses (ids 3..15), rewards mixing 0
// and 1, behaviour log-probs near zero and, optionally, full teacher rows.
// `vocab`: the teacher rows' width (the model's vocabulary).
inline std::vector<ScoredGroup> RandomGroups(int64_t num_groups, int64_t group_size,
                                             bool with_teacher, uint64_t seed, int64_t vocab = 16) {
  torch::manual_seed(seed);
  std::vector<ScoredGroup> groups(num_groups);
  for (int64_t g = 0; g < num_groups; ++g) {
    groups[g].prompt_tokens = {1, 3 + g, 4 + g};
    for (int64_t i = 0; i < group_size; ++i) {
      ScoredSample s;
      const int64_t len = 2 + (g + i) % 4;
      for (int64_t k = 0; k < len; ++k) s.response_tokens.push_back(3 + (5 * g + 3 * i + k) % 13);
      s.behavior_logprobs.assign(len, -2.5f + 0.1f * static_cast<float>(i));
      s.reward = static_cast<float>((g + i) % 2);
      if (with_teacher) s.teacher_logprobs = torch::log_softmax(2 * torch::randn({len, vocab}), -1);
      groups[g].samples.push_back(std::move(s));
    }
  }
  return groups;
}

inline std::vector<torch::Tensor> Grads(model::Decoder& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m->parameters()) {
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  }
  return out;
}

inline double GlobalNorm(const std::vector<torch::Tensor>& ts) {
  double sq = 0;
  for (const auto& t : ts) sq += t.to(torch::kFloat64).square().sum().item<double>();
  return std::sqrt(sq);
}

inline void ZeroGrads(model::Decoder& m) {
  for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
}

}  // namespace kappa::learner::testing
