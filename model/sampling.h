// Sampling responses to prompts: model::Sample, a DecodeEngine stepped until idle.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/token_sampler.h"
#include "model/transformer.h"

namespace kappa::model {

// The settings of Sample(): every row's TokenSampling (temperature, top_p,
// top_k, min_p, sampleable_vocab_size; see model/token_sampler.h, where
// sampleable_vocab_size 0 means every row of the model) and the batch's.
struct SamplingParams : TokenSampling {
  int64_t max_new_tokens = 16;  // >= 0
  // One seed per prompt row: row b draws its tokens from
  // RowRandom(row_seeds[b]) (model/token_sampler.h), as the decode engine
  // does. Empty: Sample() draws one 63-bit base seed from `generator` (the
  // global generator when it is undefined) and row b draws from
  // RowRandom(RowSeed(base, b)); so the same generator state gives the same
  // samples, and a generator is advanced by one draw per call.
  std::vector<uint64_t> row_seeds;
  // A row ends at the first of these it samples (kept as its last token):
  // model::StopTokenIds of the model (generation_config.json's eos_token_id,
  // else config.json's). Empty: rows end only at their budget. Each in
  // [0, vocab_size).
  std::vector<int64_t> stop_token_ids;
  // In [0, vocab_size). Checked only: rows are decoded in slots of their
  // own, never padded.
  int64_t pad_id = 0;
  // Asked before each decode step; when it returns true, Sample returns at
  // once and rows not finished yet are left empty (a server whose caller
  // went away or whose deadline passed). Empty: never.
  std::function<bool()> should_stop;

  // The per-row settings: the one conversion to what the decode engine and
  // SampleTokens take.
  const TokenSampling& token_sampling() const { return *this; }
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

// Samples one response per prompt: adds the prompts to a model::DecodeEngine
// with a slot per row and steps it until idle (consecutive equal prompts
// are one request sharing a prefill; pass a prompt G times to sample G
// responses). A row ends at its first stop id or at its budget (a row whose
// prompt fills the position table returns empty and truncated). Each row
// draws from its own stream (SamplingParams::row_seeds), so its tokens do not
// depend on the other prompts; greedy rows are the argmax. Runs under
// NoGradGuard. `generator` may be undefined (global RNG); it is on the
// model's device (MakeGenerator). Throws std::invalid_argument on bad params (a
// stop or pad id outside the vocabulary, sampleable_vocab_size outside
// [0, vocab_size], ...) or prompts (empty, ids outside the vocabulary,
// longer than the position table).
std::vector<SampledSequence> Sample(Decoder& model,
                                    const std::vector<std::vector<int64_t>>& prompts,
                                    const SamplingParams& params,
                                    std::optional<at::Generator> generator = std::nullopt);

}  // namespace kappa::model
