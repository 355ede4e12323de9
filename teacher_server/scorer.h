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
  kTopK,     // logprobs [T, k] (descending), topk_ids [T, k] int32 and
             // tail_logmass [T]
  kSampled,  // logprobs [T]: log q(response_tokens[t])
  kHidden,   // hidden [T, D]: the final-normed hidden states the head reads
};

struct ScoredTensors {
  torch::Tensor logprobs;  // float32, CPU
  torch::Tensor topk_ids;  // int32, CPU; kTopK only (undefined otherwise)
  // float32, CPU; kTopK only: log Σ_{v ∉ topk_ids} q(v), the teacher's tail
  // mass taken from the float32 row itself (TailLogMass below).
  torch::Tensor tail_logmass;
  torch::Tensor hidden;  // float32, CPU; kHidden only (logprobs then undefined)
};

// log of the mass outside each row's `ids`: logsumexp over the ids of
// `logprobs` [T, V] (float32) that are not in `ids` [T, k], [T] float32;
// −inf when the k ids are the whole row. Summing the tail, not subtracting
// the k largest from 1, keeps it exact to float32 on a peaked row (top-1
// 0.99, tail 1e-5), where 1 − Σ top-k rounds to 0 or below. Works on 32
// rows at a time, so its extra memory is 32 rows, not [T, V].
torch::Tensor TailLogMass(const torch::Tensor& logprobs, const torch::Tensor& ids);

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

// The same forward's output-head inputs: every sequence's response rows of
// the last hidden state after the final norm, [R, D] for R = Σ T_i, on the
// model's device in its dtype, and T_i per sequence. Row t of sequence i is
// the state whose head row predicts response_tokens[t]. Throws as
// ResponseLogProbs does.
struct ResponseHiddenRows {
  torch::Tensor rows;           // [R, D]
  std::vector<int64_t> counts;  // T_i, summing to R
};
ResponseHiddenRows ResponseHidden(model::Decoder& model,
                                  const std::vector<const TokenSequence*>& sequences);

// log_softmax(rows W^T) over the first vocab_limit ids (0: every row of
// the head), float32 on the CPU: [R, V] for hidden rows [R, D].
torch::Tensor HeadLogProbs(model::Decoder& model, const torch::Tensor& rows, int64_t vocab_limit);

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
// The same check for kHidden rows ("non-finite hidden value ...").
absl::Status CheckFiniteHidden(const torch::Tensor& hidden, const std::string& field);

// ResponseLogProbs followed by SelectForm for every sequence; kHidden:
// ResponseHidden's rows (float32, CPU) for every sequence.
std::vector<ScoredTensors> ScoreSequences(model::Decoder& model,
                                          const std::vector<const TokenSequence*>& sequences,
                                          ScoreForm form, int64_t top_k = 0,
                                          int64_t vocab_limit = 0);

}  // namespace kappa::teacher
