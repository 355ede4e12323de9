// The losses of one training batch from a single forward pass: the GRPO
// reward loss L_R, the teacher distillation loss L_D and, when the batch
// carries teacher demonstrations (RSTG), the SFT term L_SFT, kept apart so
// the caller can backward them separately (κ, balancing) or together.
// Two stages: ComputeTokenTerms gives the per-position terms ℓ_R(n), ℓ_D(n)
// (K_DR, masks and gates need them), AggregateTerms weights and averages.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "learner/algo/balance.h"
#include "learner/algo/cross_kernel.h"
#include "learner/algo/fused_head.h"
#include "learner/algo/losses.h"
#include "learner/algo/train_batch.h"
#include "learner/algo/vocab_head.h"
#include "model/autocast_state.h"
#include "model/transformer.h"

namespace kappa::learner {

struct LossConfig {
  Aggregation aggregation = Aggregation::kTokenMean;
  PpoConfig ppo;
  DistillLoss distill = DistillLoss::kReverseKl;
  int64_t distill_topk = 8;  // k of the top-k losses (the teacher rows carry it)
  double lambda = 1.0;
  // Student log-probs are taken under softmax(logits / temperature), the
  // distribution the rollout sampled from (so the PPO ratio is 1 on-policy).
  double temperature = 1.0;
  // The ids p_n is a distribution over (model::VocabLimit: the tokenizer's
  // size). The logits of padded embedding rows above it are dropped before
  // every softmax, so they get no mass in L_R, L_D, the entropy or L_SFT,
  // and full teacher rows are this wide. 0: every row of the model.
  int64_t vocab_limit = 0;
  // > 0: the output projection, log-softmax and every term over the
  // vocabulary run in chunks of this many positions (vocab_head.h), at
  // response positions only, so no [B, L, V] tensor is held; 0: one
  // [B, L, V] log-softmax per micro-batch (the fused kernels on CUDA).
  int64_t vocab_chunk_positions = 0;
  // With chunks: the training step's forward runs the fused head
  // (fused_head.h: the logit gradients formed in the forward, no second
  // pass over V); false: the node that recomputes each chunk in backward
  // (vocab_head.h). HybridStep reads it; ComputeTokenTerms is always the
  // recomputing node (exact K_DR and RSTG need per-position graphs).
  bool fused_head = true;
};

// Per-position terms, aligned with batch.target_tokens; with graph unless noted.
// V below is the vocabulary limit (LossConfig::vocab_limit), not the rows.
// With the chunked vocabulary head (vocab_chunk_positions > 0) `logits` and
// `logprobs` are undefined, the [B, L] terms are 0 outside the response
// positions, and `output_weight` / `head_positions` say how to recompute a
// chunk of the distribution (HeadInputs).
struct TokenTerms {
  torch::Tensor logits;                // [B, L, V] raw model logits of the first V ids
  torch::Tensor hidden;                // [B, L, D] input of the output projection
  torch::Tensor logprobs;              // [B, L, V] log_softmax(logits / τ)
  torch::Tensor output_weight;         // [V, D] the output projection's first V rows (chunked head)
  torch::Tensor head_positions;        // [M] int64 flat indices into [B·L] (chunked head)
  model::AutocastState head_autocast;  // the chunked head's autocast state in the forward
  torch::Tensor token_logprobs;        // [B, L] log π_θ(y_n)
  torch::Tensor reward;                // [B, L] ℓ_R(n)
  torch::Tensor distill;               // [B, L] ℓ_D(n); undefined without teacher log-probs
  torch::Tensor entropy;               // [B, L] H(p_n), no graph
  torch::Tensor sft_nll;               // scalar mean NLL of the demonstrations; undefined if none
  torch::Tensor sft_count;             // demonstration tokens sft_nll averages over
};

// Runs the model on `batch`, which must already be on the model's device.
// Full teacher rows feed reverse_kl, forward_kl and sampled_reverse_kl;
// top-k rows the two top-k losses; sampled rows ([B, L]) only
// sampled_reverse_kl; hidden rows the full-distribution losses through the
// chunked head only (vocab_chunk_positions > 0). std::invalid_argument
// otherwise, and on a teacher vocabulary that differs from the model's.
TokenTerms ComputeTokenTerms(model::Decoder& model, const TrainBatch& batch,
                             const LossConfig& config);

// ℓ_D per position from the student's log-probs [..., V] and log p(y)
// [...]: the form `kind` reads of `teacher` (full or hidden rows for the
// full-distribution losses, top-k rows for the top-k losses, full or
// sampled rows for sampled_reverse_kl). Hidden rows are turned into log q
// for the rows given: pass a bounded chunk. std::invalid_argument for rows
// the loss cannot read.
torch::Tensor DistillTermFromLogProbs(const torch::Tensor& logprobs,
                                      const torch::Tensor& token_logprobs,
                                      const TeacherRows& teacher, const torch::Tensor& targets,
                                      DistillLoss kind);

// The chunked head's inputs at tokens.head_positions of `batch`, without
// graph: what VocabHeadLogitKernel recomputes the distribution from.
// REQUIRES: `tokens` came from the chunked head (output_weight defined).
VocabHeadInputs HeadInputs(const TokenTerms& tokens, const TrainBatch& batch,
                           const LossConfig& config);

// Which terms count, and how much, at each position. Undefined tensors mean
// "every response position, weight 1".
struct TermWeights {
  torch::Tensor reward;        // [B, L] multiplies ℓ_R(n) (m3_mask)
  torch::Tensor distill;       // [B, L] multiplies ℓ_D(n) (RSTG confidence, m3_mask)
  torch::Tensor distill_mask;  // [B, L] positions L_D averages over (RSTG selection)
  // Gate `none`, or a gate that selected nothing: L_D is a graph-less zero.
  bool no_distill = false;
};

struct LossTerms {
  // Scalars. distill_loss / sft_loss are graph-less zeros when the batch has
  // no such term (check requires_grad() before backward).
  torch::Tensor reward_loss;
  torch::Tensor distill_loss;
  torch::Tensor sft_loss;
  // A plain step through the fused head: w_R s_R L_R + w_D s_D L_D
  // precombined with the weights PolicyOptimizer::PlainWeights gave, with
  // the graph; reward_loss and distill_loss are then values without one,
  // and combined_distill says whether L_D is in it. Undefined otherwise.
  torch::Tensor combined_loss;
  bool combined_distill = false;
  torch::Tensor logits;  // [B, L, V] raw model logits, with graph
  // What each mean above was taken over (tokens or sequences, per the
  // aggregation; 0 for an absent term), unclamped, without graph. A
  // data-parallel step weighs each rank's gradient by them, so R ranks give
  // the gradient of the mean over the whole batch, not a mean of means.
  torch::Tensor reward_count;
  torch::Tensor distill_count;
  torch::Tensor sft_count;
  // Over response tokens (token mean), without graph.
  double entropy = 0.0;        // H(p_n) under the temperature
  double clip_fraction = 0.0;  // share of tokens where the PPO clip is active
  double approx_kl = 0.0;      // k3 estimate of KL(π_old ‖ π_θ)
};

// L_R = agg(w_R ℓ_R) over the response mask; L_D = agg(w_D ℓ_D) over the
// distillation mask; L_SFT as computed. Plus the no-graph diagnostics.
LossTerms AggregateTerms(const TokenTerms& tokens, const TrainBatch& batch,
                         const LossConfig& config, const TermWeights& weights = {});

// The no-graph diagnostics of LossTerms (entropy, clip fraction, approx KL:
// token means over the response positions) from `tokens`, into *terms.
void AddDiagnostics(const TokenTerms& tokens, const TrainBatch& batch, const LossConfig& config,
                    LossTerms* terms);

// m3_mask as the fused head applies it: on the weights of `target`, from
// the K_DR `estimator` (logit or last_layer), soft at `temperature` > 0.
struct FusedMask {
  bool on = false;
  BalanceConfig::MaskTarget target = BalanceConfig::MaskTarget::kReward;
  KdrEstimator estimator = KdrEstimator::kLogit;
  double temperature = 0.0;
};

// What L_R's and L_D's means of one micro-batch are taken over (tokens or
// sequences: LossTerms' reward_count, distill_count), from the masks alone;
// distill 0 when `weights` says no L_D.
std::pair<torch::Tensor, torch::Tensor> TermCounts(const TrainBatch& batch,
                                                   const LossConfig& config,
                                                   const TermWeights& weights);

// The weights of a plain step's one backward that the fused head folds into
// its single stored gradient (FusedHeadInputs::combine).
struct FusedCombine {
  double reward = 0.0, distill = 0.0;
};

// The training forward of one micro-batch through the fused head: what
// ComputeTokenTerms, the cheap logit K_DR, m3_mask and AggregateTerms give
// together, with one pass over the vocabulary per chunk. `weights` as for
// AggregateTerms, except `reward` (m3_mask's, applied inside from `mask`
// when the batch has teacher rows). tokens: token_logprobs, reward,
// distill, entropy [B, L] without graph, hidden with graph, SFT as
// ComputeTokenTerms; terms: L_R and L_D with graph and the counts and
// diagnostics of AggregateTerms. With `combine` (a plain step), the head
// stores one gradient and terms.combined_loss carries it. REQUIRES:
// config.vocab_chunk_positions > 0 (else std::invalid_argument); `batch`
// on the model's device.
struct FusedStepTerms {
  TokenTerms tokens;
  LossTerms terms;
  torch::Tensor logit_kernel;  // [B, L] g_R·g_D, 0 off the response; undefined without L_D
  torch::Tensor mask_weights;  // [B, L] m3_mask's, with the mask on; else undefined
  double layers_seconds = 0.0, head_seconds = 0.0;  // host wall time of the two parts
};
FusedStepTerms ComputeFusedStepTerms(model::Decoder& model, const TrainBatch& batch,
                                     const LossConfig& config, const TermWeights& weights,
                                     const FusedMask& mask,
                                     const std::optional<FusedCombine>& combine = std::nullopt);

// The training–inference mismatch sums over the positions where `mask` [B, L]
// is 1: [Σ |d|, Σ k3, Σ mask] in float64, no graph, on the inputs' device,
// with d = log π_θ(y_n) − log π_behaviour(y_n) (`token_logprobs`, the loss's,
// against `behaviour_logprobs`, TrainBatch::old_logprobs) and k3 =
// (e^d − 1) − d, the k3 estimate of KL(π_behaviour ‖ π_θ) on tokens sampled
// from π_behaviour (d clamped to ±20 inside the exponential, as approx_kl).
torch::Tensor InferenceMismatchSums(const torch::Tensor& token_logprobs,
                                    const torch::Tensor& behaviour_logprobs,
                                    const torch::Tensor& mask);

// Both stages with default weights; `batch` is moved to the model's device.
LossTerms ComputeLossTerms(model::Decoder& model, const TrainBatch& batch,
                           const LossConfig& config);

}  // namespace kappa::learner
