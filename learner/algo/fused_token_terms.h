// The per-position terms of the default hybrid loss (PPO token log-prob,
// reverse KL to a full-vocabulary teacher, entropy) from one log-softmax over
// the logits, as one autograd node (docs/algorithms.md §2.2, issue 7).
//
// The unfused path (log_softmax → gather, exp·(log p − log q) → sum) makes
// autograd keep the log-probs, their exp and the difference, each
// [B, L, V], alive through both the L_R and the L_D backward passes of the κ
// monitor. This node keeps only the fp32 log-probs and its backward is the
// closed form of logit_gradients.h:
//   ∂/∂z = (g_tok ⊙ (onehot(y) − p) + g_kl ⊙ p ⊙ (log p − log q − KL)) / τ,
// with either incoming gradient possibly absent (separate backward passes).
// On CUDA tensors, in a build with KAPPA_CUDA, forward and backward run as
// the kernels of learner/algo/cuda/fused_token_terms.cu; otherwise as torch
// ops over chunks of rows (no [B, L, V] temporary beyond one chunk).
#pragma once

#include <torch/types.h>

namespace kappa::learner {

struct FusedTokenTerms {
  torch::Tensor logprobs;        // [..., V] log_softmax(logits / τ), no graph (fp32; fp64 for fp64 logits)
  torch::Tensor token_logprobs;  // [...] log p(y_n), with graph
  torch::Tensor reverse_kl;      // [...] Σ_v p (log p − log q), with graph
  torch::Tensor entropy;         // [...] H(p_n), no graph
};

enum class FusedImpl {
  kAuto,      // the CUDA kernels for CUDA float / bfloat16 logits when built with them
  kTorchOps,  // torch ops on any device (the reference the kernels are tested against)
};

// logits [..., V] (float32, bfloat16, float16 or float64; computed in float32
// at least), targets [...] (int64 ids in [0, V)), teacher_logprobs [..., V]
// (log q; data, receives no gradient), temperature τ > 0. Throws
// std::invalid_argument on mismatched shapes or τ <= 0.
FusedTokenTerms ComputeFusedTokenTerms(const torch::Tensor& logits, const torch::Tensor& targets,
                                       const torch::Tensor& teacher_logprobs, double temperature,
                                       FusedImpl impl = FusedImpl::kAuto);

// True when this build carries the CUDA kernels (KAPPA_CUDA).
bool FusedTokenTermsHasCudaKernels();

}  // namespace kappa::learner
