// Teacher-forced scoring: the teacher's next-token log-probs at every
// response position of a batch of prompt+response sequences, from ONE
// right-padded forward pass. Row t of a sequence's result is the distribution
// that predicts response_tokens[t], i.e. the logits at position
// len(prompt) - 1 + t.
//
// No proto types here: the service translates messages at its edge.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/transformer.h"

namespace kappa::teacher {

struct TokenSequence {
  std::vector<int64_t> prompt_tokens;    // non-empty
  std::vector<int64_t> response_tokens;  // non-empty
};

enum class ScoreForm {
  kFull,     // logprobs [T, V]
  kTopK,     // logprobs [T, k] (descending) and topk_ids [T, k] int32
  kSampled,  // logprobs [T]: log q(response_tokens[t])
};

struct ScoredTensors {
  torch::Tensor logprobs;  // float32, CPU
  torch::Tensor topk_ids;  // int32, CPU; kTopK only (undefined otherwise)
};

// Log-probs [T_i, V] (float32, CPU) at the response positions of each
// sequence, over the first V = vocab_limit ids (0: every row of the model):
// the logits of padded embedding rows above it are dropped before the
// log_softmax, so the distribution puts no mass there and is the one a
// student with the same tokenizer compares against (model::VocabLimit).
// Sequences are right-padded with the model's pad id and masked; the forward
// runs under NoGradGuard and log_softmax runs once over all gathered rows.
// The caller validates inputs (non-empty, ids in range, total length within
// max_position_embeddings); violations, and a vocab_limit outside
// [0, vocab_size], throw std::invalid_argument. The returned tensors may be
// views of one buffer.
std::vector<torch::Tensor> ResponseLogProbs(model::Decoder& model,
                                            const std::vector<const TokenSequence*>& sequences,
                                            int64_t vocab_limit = 0);

// Reduces one sequence's [T, V] log-probs to `form`. `top_k` must be in
// [1, V] for kTopK (std::invalid_argument otherwise); ignored else. kSampled
// needs every response token below V.
ScoredTensors SelectForm(const torch::Tensor& full_logprobs,
                         const std::vector<int64_t>& response_tokens, ScoreForm form,
                         int64_t top_k);

// OK, or INTERNAL naming `field` and the first response position (row) of
// `logprobs` ([T] or [T, ...], as SelectForm returns them) that holds a NaN
// or an infinity: "<field>: non-finite log-prob nan at response position 2
// (...)". The teacher's own output is then broken (a corrupt checkpoint, an
// overflow); the service sends no such row, and the learner would refuse it.
absl::Status CheckFiniteLogProbs(const torch::Tensor& logprobs, const std::string& field);

// ResponseLogProbs followed by SelectForm for every sequence.
std::vector<ScoredTensors> ScoreSequences(model::Decoder& model,
                                          const std::vector<const TokenSequence*>& sequences,
                                          ScoreForm form, int64_t top_k = 0,
                                          int64_t vocab_limit = 0);

}  // namespace kappa::teacher
