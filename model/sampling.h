// Batched autoregressive sampling with a KV cache.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "model/transformer.h"

namespace kappa::model {

struct SamplingParams {
  int64_t max_new_tokens = 16;
  double temperature = 1.0;  // 0 = greedy (argmax)
  double top_p = 1.0;        // nucleus sampling; 1 = full distribution
  int64_t top_k = 0;         // the k most likely tokens only; 0 = off
  double min_p = 0.0;        // drop tokens below min_p × the top probability; 0 = off
  // One seed per prompt row: row b draws its tokens with model::SampleTokens
  // from RowRandom(row_seeds[b]) (model/token_sampler.h), independent of the
  // other rows, as the decode engine does. Empty: the rows draw from
  // `generator` together (torch::multinomial), unless top_k or min_p is set,
  // which also selects SampleTokens (with uniforms drawn from `generator`).
  std::vector<uint64_t> row_seeds;
  // A row ends at the first of these it samples (kept as its last token):
  // model::StopTokenIds of the model (generation_config.json's eos_token_id,
  // else config.json's). Empty: rows end only at their budget. Each in
  // [0, vocab_size).
  std::vector<int64_t> stop_token_ids;
  int64_t pad_id = 0;
  // Ids >= this are never sampled: their logits are dropped before the
  // temperature and top-p (the same as setting them to -inf), so the
  // log-probs are over [0, sampleable_vocab_size) alone. Padded embedding
  // rows have no token; model::VocabLimit gives the value from the
  // tokenizer's size. 0: every row; else in [1, vocab_size].
  int64_t sampleable_vocab_size = 0;
};

struct SampledSequence {
  std::vector<int64_t> tokens;   // response tokens, ending with a stop id unless truncated
  std::vector<float> logprobs;   // log p(token) under softmax(logits / temperature)
                                 // (the untruncated distribution; greedy: temperature 1)
  // True when the row ended because it reached its token budget
  // (max_new_tokens, or what the position table left after its prompt)
  // without sampling a stop id; false when its last token is a stop id.
  bool truncated = false;
};

// A generator seeded with `seed` on `device`: torch::multinomial needs one on
// the device of the probabilities it draws from. CPU keeps the
// CPUGeneratorImpl every CPU run has used (same stream); CUDA clones that
// device's default generator (no CUDA headers needed) and reseeds the copy.
at::Generator MakeGenerator(const c10::Device& device, uint64_t seed);

// Samples one response per prompt, all prompts in one batch (prompts of
// different lengths are left-padded and masked). To sample G responses of a
// prompt, pass it G times. A row ends at its first stop id or at its budget;
// the batch ends when every row has. Runs under NoGradGuard. `generator` may
// be undefined (global RNG). Throws std::invalid_argument on bad params (a
// stop or pad id outside the vocabulary, sampleable_vocab_size outside
// [0, vocab_size], ...) or prompts (empty, ids outside the vocabulary,
// longer than the position table).
std::vector<SampledSequence> Sample(Decoder& model,
                                    const std::vector<std::vector<int64_t>>& prompts,
                                    const SamplingParams& params,
                                    std::optional<at::Generator> generator = std::nullopt);

}  // namespace kappa::model
