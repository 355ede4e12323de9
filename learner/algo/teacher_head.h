// The teacher's output head, held by the learner for teacher rows sent as
// hidden states (teacher.rows: hidden; docs/algorithms.md §2.5). The
// teacher sends h_n, its last hidden state after the final norm (D_t values
// a position instead of V); the learner rebuilds the teacher's exact
// distribution with the teacher's own head W_t:
//   log q_n = log_softmax(h_n W_tᵀ),
// the same distribution the teacher's full rows carry (its Score at
// temperature 1; Llama and Qwen heads have no bias and no logit scale).
//
// The head is data, not a parameter: frozen (requires_grad false), never in
// the optimizer, never published to the workers. Nothing here builds [T, V]
// for more rows than the caller passes: callers hand over one chunk of
// positions at a time (vocab_head.h), or use the row statistics below,
// which chunk themselves.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace kappa::learner {

struct TeacherHead {
  // [V, D_t]: the teacher's lm_head rows (or its tied embedding) of the ids
  // the distributions are over (the tokenizer's size; padded rows cut off),
  // on the learner's device, in the dtype the teacher itself computes in.
  torch::Tensor weight;

  bool defined() const { return weight.defined(); }
  int64_t vocab() const { return weight.size(0); }
  int64_t hidden_size() const { return weight.size(1); }

  // log q [..., V] of hidden rows [..., D_t]: the product h W_tᵀ in the
  // weight's dtype with autocast off (the teacher's own GEMM, not the
  // student's autocast one), then log_softmax in float32 (float64 for a
  // float64 weight). No graph. REQUIRES: defined(); hidden's last size is
  // D_t (else std::invalid_argument naming both widths).
  torch::Tensor LogProbs(const torch::Tensor& hidden) const;
  // The logits h W_tᵀ alone, in the weight's dtype (LogProbs is
  // log_softmax(Logits(hidden)) in float32 at least, which a caller that
  // normalizes a row at a time does itself with SoftmaxLogProbs). Same
  // requirements.
  torch::Tensor Logits(const torch::Tensor& hidden) const;
  // log_softmax of logits rows [..., V] as LogProbs normalizes them.
  torch::Tensor SoftmaxLogProbs(const torch::Tensor& logits) const;

  // Per-row statistics of log q over hidden rows [..., D_t], a bounded
  // block of rows at a time (never [rows, V] at once): max_v log q [...],
  // and log q(targets) [...] for int64 targets of hidden's leading shape.
  torch::Tensor MaxLogProb(const torch::Tensor& hidden) const;
  torch::Tensor TargetLogProbs(const torch::Tensor& hidden, const torch::Tensor& targets) const;
};

}  // namespace kappa::learner
