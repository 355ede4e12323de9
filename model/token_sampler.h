// Draws one next token per row from its own sampling settings and its own
// uniform number, so what a row samples depends on its logits, its settings
// and its seed alone, never on the rows it is batched with: the continuous
// decode engine (rows join and leave a batch every step) and model::Sample
// with per-row seeds draw the same tokens.
//
// Per row, in Hugging Face generate's order: logits of the sampleable ids
// (the rest are dropped) / temperature → top-k → top-p (over the
// distribution top-k left, renormalized) → min-p (relative to the top
// probability, so renormalizing does not move it); then the token is the
// inverse CDF of the kept probabilities at u · (their sum), with u in [0, 1)
// the row's uniform. Greedy rows (temperature 0) take the argmax.
//
// The log-prob returned is log softmax(logits / temperature) at the token
// over every sampleable id, before top-k, top-p and min-p (temperature 1 for
// greedy rows): what the learner recomputes for the same policy.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <random>
#include <vector>

namespace kappa::model {

struct TokenSampling {
  double temperature = 1.0;  // 0: greedy (argmax)
  double top_p = 1.0;        // (0, 1]; 1: off
  int64_t top_k = 0;         // >= 0; 0 (or >= the sampleable ids): off
  double min_p = 0.0;        // [0, 1]; 0: off
  // Ids >= this are never sampled and outside the log-probs' distribution;
  // in [1, V] for SampleTokens. 0 in a SamplingParams or a DecodeRequest:
  // every row of the model (they resolve it).
  int64_t sampleable_vocab_size = 0;
};

struct SampledTokens {
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
};

// One uniform stream per row: a row's k-th draw depends on its seed and k
// alone (mt19937_64, 53-bit doubles in [0, 1)).
class RowRandom {
 public:
  explicit RowRandom(uint64_t seed) : engine_(seed) {}
  double NextUniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

// The seed of row `row` of a request seeded `request_seed`: SplitMix64 of
// both, so rows of one request and requests with nearby seeds get unrelated
// streams.
uint64_t RowSeed(uint64_t request_seed, int64_t row);

// Checks one row's settings; throws std::invalid_argument naming the bad one
// (`vocab_size`: the logits' width).
void ValidateTokenSampling(const TokenSampling& sampling, int64_t vocab_size);

// logits: [R, V] (any floating dtype, any device); rows.size() == R ==
// uniforms.size(). Returns the R tokens and their log-probs on the host.
// Runs under no-grad. REQUIRES: every row passes ValidateTokenSampling
// (checked: std::invalid_argument otherwise).
SampledTokens SampleTokens(const torch::Tensor& logits, const std::vector<TokenSampling>& rows,
                           const std::vector<double>& uniforms);

}  // namespace kappa::model
