// The student's per-position terms over the vocabulary (log p(y_n), ℓ_D(n),
// H(p_n)) computed from the hidden states in chunks of positions
// (trainer.vocab_chunk_positions, docs/algorithms.md §2.4), so the [N, V]
// logits of a whole micro-batch never exist.
//
// The output projection is part of the node: forward multiplies one chunk
// of hidden states by the output weight at a time and keeps only [N]-sized
// results; backward recomputes each chunk's logits from the saved hidden
// states and weight and returns ∂/∂h and ∂/∂W through the closed forms of
// logit_gradients.h (the fused linear-cross-entropy of Liger and
// torchtune). The price is one more output projection per backward pass.
//
// What reaches the distillation loss from the node is small: the logsumexp
// per position, the target's logit and, for the top-k losses, the k logits
// at the teacher's ids; the full-vocabulary KLs are reduced inside it.
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "learner/algo/losses.h"
#include "model/autocast_state.h"

namespace kappa::learner {

struct VocabHeadInputs {
  torch::Tensor hidden;   // [N, D] with graph: the input of the output projection
  torch::Tensor weight;   // [V, D] with graph: the projection's rows of the vocabulary
  torch::Tensor targets;  // [N] int64 in [0, V)
  // [N, ...] (TeacherRows::Flatten), or undefined: no ℓ_D. Hidden rows
  // [N, D_t] carry the teacher's head [V, D_t]; the KLs then rebuild log q
  // one chunk of positions at a time from them (never [N, V]).
  TeacherRows teacher;
  DistillLoss distill = DistillLoss::kReverseKl;
  double temperature = 1.0;
  int64_t chunk_positions = 1024;  // > 0: positions per chunk of logits
  // The autocast state the loss's forward ran the head under: the kernel
  // (VocabHeadLogitKernel) recomputes the logits under it, so it reads the
  // loss's own (bfloat16-product) logits. ComputeVocabHeadTerms ignores it:
  // it runs under the caller's state.
  model::AutocastState autocast = {};
};

struct VocabHeadTerms {
  torch::Tensor token_logprobs;  // [N] log p(y_n), with graph
  torch::Tensor distill;         // [N] ℓ_D(n), with graph; undefined without teacher rows
  torch::Tensor entropy;         // [N] H(p_n), no graph
};

// The terms at every one of the N positions, with p = softmax(h W^T / τ)
// computed in float32 at least. Throws std::invalid_argument on mismatched
// shapes, τ <= 0, chunk_positions <= 0, or teacher rows the loss cannot read.
VocabHeadTerms ComputeVocabHeadTerms(const VocabHeadInputs& in);

// The incoming gradients of the node's outputs for one chunk of n
// positions, each undefined when that output got none: ∂/∂logsumexp [n],
// ∂/∂s at the target [n], ∂/∂s at the top-k ids [n, k], ∂/∂(full KL) [n].
struct VocabHeadOutputGrads {
  torch::Tensor lse, target, set, kl;
};

// What the node's backward computes for one chunk: ∂/∂s [n, V] of all it
// gave out, from the chunk's recomputed scaled logits s [n, V] (float32 or
// float64). p is normalised by s's own logsumexp, never by a saved one, so
// for incoming gradients of log-probabilities (g.lse = −(g.target + Σ g.set))
// every row sums to 0 to the rounding of s's type whatever rounding s
// itself took (a bfloat16 GEMM under autocast; docs/algorithms.md §2.4).
// The full KL's form is the reverse KL's (reverse_kl) or the forward KL's.
// REQUIRES: s [n, V]; targets [n] int64; topk_ids [n, k] int64 when g.set
// is defined; full_teacher [n, V] log q when g.kl is defined (else
// std::invalid_argument naming the argument).
torch::Tensor VocabHeadChunkLogitGradient(const torch::Tensor& s, const VocabHeadOutputGrads& g,
                                          const torch::Tensor& targets,
                                          const torch::Tensor& topk_ids,
                                          const torch::Tensor& full_teacher, bool reverse_kl);

// The logit estimator of K_DR, g_R(n)·g_D(n) per position, [N], without
// graph: both closed-form logit gradients one chunk at a time.
// reward_coefficient [N] is c_n (RewardLogProbCoefficient).
// REQUIRES: in.teacher defined, reward_coefficient [N] (else, as for
// ComputeVocabHeadTerms's inputs, std::invalid_argument).
torch::Tensor VocabHeadLogitKernel(const VocabHeadInputs& in,
                                   const torch::Tensor& reward_coefficient);

}  // namespace kappa::learner
