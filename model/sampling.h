// Batched autoregressive sampling with a KV cache.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "model/transformer.h"

namespace kappa::model {

struct SamplingParams {
  int64_t max_new_tokens = 16;
  double temperature = 1.0;  // 0 = greedy (argmax)
  double top_p = 1.0;        // nucleus sampling; 1 = full distribution
  int64_t eos_id = 2;
  int64_t pad_id = 0;
};

struct SampledSequence {
  std::vector<int64_t> tokens;   // response tokens, ending with EOS unless truncated
  std::vector<float> logprobs;   // log p(token) under softmax(logits / temperature)
                                 // (the untruncated distribution; greedy: temperature 1)
};

// A generator seeded with `seed` on `device`: torch::multinomial needs one on
// the device of the probabilities it draws from. CPU keeps the
// CPUGeneratorImpl every CPU run has used (same stream); CUDA clones that
// device's default generator (no CUDA headers needed) and reseeds the copy.
at::Generator MakeGenerator(const c10::Device& device, uint64_t seed);

// Samples one response per prompt, all prompts in one batch (prompts of
// different lengths are left-padded and masked). To sample G responses of a
// prompt, pass it G times. Runs under NoGradGuard. `generator` may be
// undefined (global RNG).
std::vector<SampledSequence> Sample(Decoder& model,
                                    const std::vector<std::vector<int64_t>>& prompts,
                                    const SamplingParams& params,
                                    std::optional<at::Generator> generator = std::nullopt);

}  // namespace kappa::model
