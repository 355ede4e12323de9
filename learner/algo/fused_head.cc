#include "learner/algo/fused_head.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

#include "learner/algo/hybrid_loss.h"
#include "learner/algo/logit_gradients.h"
#include "learner/algo/logprob_losses.h"
#include "model/autocast_state.h"

namespace kappa::learner {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// float32 at least: half-precision logits lose too much in the normalizer.
torch::ScalarType ComputeType(torch::ScalarType hidden) {
  return hidden == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// What a block of n positions gives: its terms [n], its weighted terms
// w(n) ℓ(n) [n] (L_R and L_D are their sums) and its weighted logit
// gradients ∂L_R/∂z, ∂L_D/∂z [n, V] (the L_D ones undefined without teacher
// rows).
struct ChunkTerms {
  torch::Tensor token_logprobs, reward, distill, entropy, kernel, mask_weights;
  torch::Tensor weighted_reward, weighted_distill;
  torch::Tensor reward_logit_grad, distill_logit_grad;
};

// w ℓ, 0 where w is (a zero-weight position, e.g. padding, may hold
// anything, and 0 · ∞ is NaN).
torch::Tensor Weighted(const torch::Tensor& terms, const torch::Tensor& weights) {
  return terms.masked_fill(weights == 0, 0) * weights;
}

// Rows [start, start + n) of a per-position input.
torch::Tensor Rows(const torch::Tensor& t, int64_t start, int64_t n) {
  return t.narrow(0, start, n);
}

// m3_mask's weights of the chunk from its logit kernel; the last_layer
// estimator scales it by ‖h_n‖² (cross_kernel.h), which a soft mask reads.
torch::Tensor MaskWeights(const FusedHeadInputs& in, const torch::Tensor& logit_kernel,
                          const torch::Tensor& hidden) {
  const torch::Tensor kernel =
      in.mask_estimator == KdrEstimator::kLastLayer
          ? LastLayerCrossKernel(logit_kernel.unsqueeze(0), hidden.unsqueeze(0)).squeeze(0)
          : logit_kernel;
  return ConflictMaskWeights(kernel, in.mask_temperature);
}

// Everything of the n positions from `start` on from their scaled logits
// s = h Wᵀ / τ (compute type) and their teacher rows (`teacher`, already
// narrowed to them; full rows for the hidden form).
ChunkTerms TermsOfChunk(const FusedHeadInputs& in, const TeacherRows& teacher,
                        const torch::Tensor& s, const torch::Tensor& hidden, int64_t start,
                        int64_t n) {
  ChunkTerms out;
  const torch::Tensor lp = s - s.logsumexp(-1, /*keepdim=*/true);
  const torch::Tensor y = Rows(in.targets, start, n);
  const torch::Tensor old = Rows(in.old_logprobs, start, n).to(lp.scalar_type());
  const torch::Tensor advantages = Rows(in.advantages, start, n).to(lp.scalar_type());
  const torch::Tensor p = lp.exp();
  out.token_logprobs = GatherTokenLogProbs(lp, y);
  out.entropy = -(p * lp).sum(-1);
  out.reward = PpoTokenLoss(out.token_logprobs, old, advantages, in.ppo);
  // g_R(n) = c_n (e_y − p) / τ (logit_gradients.h), never formed as [n, V]:
  // the kernel and ∂L_R/∂z below expand it where they need it.
  const torch::Tensor reward_coefficient =
      RewardLogProbCoefficient(out.token_logprobs, old, advantages, in.ppo) / in.temperature;
  torch::Tensor reward_weight = Rows(in.reward_weights, start, n).to(lp.scalar_type());
  torch::Tensor distill_weight;
  torch::Tensor g_d;
  if (teacher.defined()) {
    out.distill = DistillTermFromLogProbs(lp, out.token_logprobs, teacher, y, in.distill)
                      .to(lp.scalar_type());
    g_d = DistillLogitGradient(lp, teacher, y, in.distill, in.temperature);
    // g_R·g_D = c_n/τ (g_D(y) − p·g_D).
    out.kernel =
        reward_coefficient * (g_d.gather(-1, y.unsqueeze(-1)).squeeze(-1) - (p * g_d).sum(-1));
    distill_weight = Rows(in.distill_weights, start, n).to(lp.scalar_type());
    if (in.mask) {
      out.mask_weights = MaskWeights(in, out.kernel, hidden).to(lp.scalar_type());
      if (in.mask_target == BalanceConfig::MaskTarget::kReward) {
        reward_weight = reward_weight * out.mask_weights;
      } else {
        distill_weight = distill_weight * out.mask_weights;
      }
    }
    // g_D is ours: weighted in place. Its rows are finite (BuildTrainBatch
    // refuses non-finite teacher rows; the head reads response positions).
    out.distill_logit_grad = g_d.mul_(distill_weight.unsqueeze(-1));
    out.weighted_distill = Weighted(out.distill, distill_weight);
  }
  // a_R m_R g_R = −(a_R m_R c_n / τ) p + the same at y.
  const torch::Tensor reward_scale = reward_weight * reward_coefficient;
  out.reward_logit_grad = (p * -reward_scale.unsqueeze(-1))
                              .scatter_add_(-1, y.unsqueeze(-1), reward_scale.unsqueeze(-1));
  out.weighted_reward = Weighted(out.reward, reward_weight);
  return out;
}

// ∂/∂h and ∂/∂W of one loss, filled chunk by chunk.
struct LossGradients {
  torch::Tensor hidden;  // [M, D]
  torch::Tensor weight;  // [V, D] float32-or-wider, or undefined (frozen head)

  // Adds one chunk's ∂L/∂z [n, V] (z = h Wᵀ, raw logits): rows of ∂L/∂h and
  // the chunk's share of ∂L/∂W, the products in h's dtype (bf16 under
  // autocast, as autograd's would be).
  void Add(const torch::Tensor& dz, const torch::Tensor& h, const torch::Tensor& w, int64_t start,
           int64_t n) {
    const torch::Tensor dz_h = dz.to(h.scalar_type());
    hidden.narrow(0, start, n).copy_(torch::matmul(dz_h, w));
    if (!weight.defined()) return;
    if (weight.scalar_type() == h.scalar_type() &&
        !model::AutocastState::Current(h.device().type()).enabled) {
      weight.addmm_(dz_h.t(), h);  // accumulated in place: no [V, D] temporary
    } else {
      weight += torch::matmul(dz_h.t(), h).to(weight.scalar_type());
    }
  }
};

// Whether a chunk's logits h Wᵀ can be written straight into a buffer of
// the compute type: h and W already in it and no autocast (whose product
// is bf16, converted after).
bool LogitsInPlace(const torch::Tensor& h, const torch::Tensor& w, torch::ScalarType compute) {
  return h.scalar_type() == compute && w.scalar_type() == compute &&
         !model::AutocastState::Current(h.device().type()).enabled;
}

// The chunk's teacher rows: the top-k, full and sampled forms narrowed to
// it; the hidden form's as the teacher's logits of the chunk (one teacher
// GEMM a chunk), which Block normalizes a block of rows at a time.
// Undefined without teacher rows.
struct ChunkTeacher {
  TeacherRows rows;      // every form but hidden
  torch::Tensor logits;  // the hidden form: [n, V] in the teacher head's dtype
  TeacherHead head;

  ChunkTeacher(const TeacherRows& teacher, int64_t start, int64_t n) {
    if (!teacher.defined()) return;
    rows = teacher.Narrow(start, n);
    if (!rows.hidden_form()) return;
    head = rows.head;
    logits = head.Logits(rows.hidden);
    rows = TeacherRows{};
  }

  // Rows [first, first + m) as the terms read them (full rows for the
  // hidden form: log q in float32).
  TeacherRows Block(int64_t first, int64_t m) const {
    if (!logits.defined()) return rows.defined() ? rows.Narrow(first, m) : TeacherRows{};
    TeacherRows full;
    full.logprobs = head.SoftmaxLogProbs(logits.narrow(0, first, m));
    return full;
  }
};

// Positions per block of a chunk's per-position work on the CPU. One row's
// [V] temporaries (0.6 MB each at V = 151,936) stay in cache and are
// reused by the allocator, where each pass over [chunk, V] goes to memory
// and each fresh [chunk, V] tensor is fresh pages the kernel zeroes.
constexpr int64_t kCpuRowsPerBlock = 1;

// fn(first, m) for blocks [first, first + m) covering [0, n): on the CPU
// blocks of kCpuRowsPerBlock rows spread over the intra-op threads (fn
// must write only its own rows), elsewhere one block of n (a GPU wants
// the whole chunk in each kernel).
void ForEachBlock(const torch::Device& device, int64_t n,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (!device.is_cpu()) {
    fn(0, n);
    return;
  }
  at::parallel_for(0, n, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    torch::NoGradGuard no_grad;  // grad mode is per thread
    for (int64_t first = begin; first < end; first += kCpuRowsPerBlock) {
      fn(first, std::min(kCpuRowsPerBlock, end - first));
    }
  });
}

// The forward's stored gradients in the node's saved_data: ∂/∂h and ∂/∂W of
// L_R, L_D and the combined loss, in the order of the node's first three
// outputs (empty where there is none).
constexpr int kLosses = 3;
constexpr const char* kGradientKeys[2 * kLosses] = {"reward_hidden",   "reward_weight",
                                                    "distill_hidden",  "distill_weight",
                                                    "combined_hidden", "combined_weight"};

// Inputs: hidden [M, D], weight [V, D] (differentiable), the rest data.
// Outputs: L_R, L_D, the combined loss (each a scalar; those without a
// stored gradient non-differentiable), then the [M] values of
// FusedHeadOutputs in its order (no gradient).
class FusedHeadFunction : public torch::autograd::Function<FusedHeadFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const FusedHeadInputs* in) {
    torch::NoGradGuard no_grad;
    const int64_t rows = hidden.size(0);
    const auto options = hidden.options().dtype(ComputeType(hidden.scalar_type()));
    const bool distill = in->teacher.defined();
    const bool weight_trains = weight.requires_grad();
    // Absent values are empty placeholders: a node's outputs are tensors.
    auto values = [&](bool defined) { return torch::zeros({defined ? rows : 0}, options); };
    torch::Tensor token_logprobs = values(true), reward = values(true), entropy = values(true),
                  distill_terms = values(distill), kernel = values(distill),
                  mask_weights = values(distill && in->mask);
    auto gradients = [&](bool defined) {
      LossGradients g;
      g.hidden = defined ? torch::zeros_like(hidden) : torch::empty({0}, hidden.options());
      g.weight = defined && weight_trains ? torch::zeros(weight.sizes(), weight.options())
                                          : torch::Tensor();
      return g;
    };
    torch::Tensor weighted_reward = values(true), weighted_distill = values(distill);
    const bool combine = in->combine;
    LossGradients reward_grads = gradients(!combine),
                  distill_grads = gradients(distill && !combine),
                  combined_grads = gradients(combine);
    const torch::Tensor w = weight.to(hidden.scalar_type());
    // One chunk's logits, then its ∂/∂z in their place (L_D's beside them
    // when each loss keeps its own gradient): reused from chunk to chunk.
    const int64_t chunk = std::min(in->chunk_positions, rows);
    const int64_t vocab = weight.size(0);
    const bool logits_in_place = LogitsInPlace(hidden, w, options.dtype().toScalarType());
    const torch::Tensor logit_buffer =
        logits_in_place ? torch::empty({chunk, vocab}, options) : torch::Tensor();
    const torch::Tensor distill_dz_buffer =
        distill && !combine ? torch::empty({chunk, vocab}, options) : torch::Tensor();
    for (int64_t start = 0; start < rows; start += in->chunk_positions) {
      const int64_t n = std::min(in->chunk_positions, rows - start);
      const torch::Tensor h = hidden.narrow(0, start, n);
      torch::Tensor s = logits_in_place ? logit_buffer.narrow(0, 0, n)
                                        : torch::matmul(h, w.t()).to(options.dtype());
      if (logits_in_place) torch::mm_out(s, h, w.t());
      if (in->temperature != 1.0) s.div_(in->temperature);
      const ChunkTeacher teacher(in->teacher, start, n);
      const torch::Tensor distill_dz =
          distill_dz_buffer.defined() ? distill_dz_buffer.narrow(0, 0, n) : torch::Tensor();
      ForEachBlock(s.device(), n, [&](int64_t first, int64_t m) {
        const int64_t at = start + first;
        ChunkTerms block = TermsOfChunk(*in, teacher.Block(first, m), s.narrow(0, first, m),
                                        h.narrow(0, first, m), at, m);
        token_logprobs.narrow(0, at, m).copy_(block.token_logprobs);
        reward.narrow(0, at, m).copy_(block.reward);
        entropy.narrow(0, at, m).copy_(block.entropy);
        weighted_reward.narrow(0, at, m).copy_(block.weighted_reward);
        if (distill) {
          distill_terms.narrow(0, at, m).copy_(block.distill);
          kernel.narrow(0, at, m).copy_(block.kernel);
          if (in->mask) mask_weights.narrow(0, at, m).copy_(block.mask_weights);
          weighted_distill.narrow(0, at, m).copy_(block.weighted_distill);
        }
        // The block's logits are read: its rows of s now take its ∂/∂z.
        torch::Tensor dz_rows = s.narrow(0, first, m);
        if (combine) {
          torch::Tensor dz = block.reward_logit_grad.mul_(in->combine_reward);
          if (distill) dz.add_(block.distill_logit_grad, in->combine_distill);
          dz_rows.copy_(dz);
        } else {
          dz_rows.copy_(block.reward_logit_grad);
          if (distill) distill_dz.narrow(0, first, m).copy_(block.distill_logit_grad);
        }
      });
      if (combine) {
        combined_grads.Add(s, h, w, start, n);
      } else {
        reward_grads.Add(s, h, w, start, n);
        if (distill) distill_grads.Add(distill_dz, h, w, start, n);
      }
    }
    const torch::Tensor reward_loss = weighted_reward.sum();
    const torch::Tensor distill_loss = weighted_distill.sum();
    const torch::Tensor combined_loss =
        reward_loss * in->combine_reward + distill_loss * in->combine_distill;
    auto or_empty = [&](const torch::Tensor& t) {
      return t.defined() ? t : torch::empty({0}, weight.options());
    };
    // In saved_data, not save_for_backward: the backward scales each in
    // place and lets it go (a [V, D] buffer per loss, 545 MB at Qwen2.5's
    // vocabulary), which a saved variable's version check forbids.
    const LossGradients* stored[kLosses] = {&reward_grads, &distill_grads, &combined_grads};
    for (int loss = 0; loss < kLosses; ++loss) {
      ctx->saved_data[kGradientKeys[2 * loss]] = stored[loss]->hidden;
      ctx->saved_data[kGradientKeys[2 * loss + 1]] = or_empty(stored[loss]->weight);
    }
    // One call: each call replaces the set the previous one marked.
    variable_list values_only = {token_logprobs, reward, entropy,
                                 distill_terms,  kernel, mask_weights};
    if (combine) {
      values_only.insert(values_only.end(), {reward_loss, distill_loss});
    } else {
      values_only.push_back(combined_loss);
    }
    ctx->mark_non_differentiable(values_only);
    ctx->set_materialize_grads(false);
    return {reward_loss,   distill_loss, combined_loss, token_logprobs, reward,
            distill_terms, entropy,      kernel,        mask_weights};
  }

  // Each loss's stored gradients, scaled in place by its incoming gradient
  // and released: a loss's backward runs once (a second one throws).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    torch::NoGradGuard no_grad;
    torch::Tensor grad_hidden, grad_weight;
    for (int loss = 0; loss < kLosses; ++loss) {
      const torch::Tensor& g = grads[loss];
      if (!g.defined() || g.numel() == 0) continue;
      for (int part = 0; part < 2; ++part) {
        torch::Tensor stored = Take(ctx, kGradientKeys[2 * loss + part]);
        if (part == 1 && !ctx->needs_input_grad(1)) continue;
        if (stored.numel() == 0) continue;  // nothing stored (a frozen head, no teacher)
        torch::Tensor& into = part == 0 ? grad_hidden : grad_weight;
        if (into.defined()) {
          into.addcmul_(stored, g.to(stored.scalar_type()));
        } else {
          into = stored.mul_(g.to(stored.scalar_type()));
        }
      }
    }
    return {grad_hidden, grad_weight, torch::Tensor()};
  }

 private:
  // saved_data's tensor under `key`, which is left empty; std::logic_error
  // when it was taken already (a second backward of the same loss).
  static torch::Tensor Take(AutogradContext* ctx, const char* key) {
    c10::IValue& slot = ctx->saved_data[key];
    if (!slot.isTensor()) {
      throw std::logic_error(std::string("fused head: ") + key +
                             " was used by an earlier backward (each loss's backward runs once)");
    }
    torch::Tensor stored = slot.toTensor();
    slot = c10::IValue();
    return stored;
  }
};

void CheckInputs(const FusedHeadInputs& in) {
  if (!(in.temperature > 0)) {
    throw std::invalid_argument("fused head: temperature must be > 0, got " +
                                std::to_string(in.temperature));
  }
  if (in.chunk_positions <= 0) {
    throw std::invalid_argument("trainer.vocab_chunk_positions must be > 0 for the fused head");
  }
  const int64_t rows = in.hidden.size(0);
  auto per_position = [&](const torch::Tensor& t) {
    return t.defined() && t.dim() == 1 && t.size(0) == rows;
  };
  if (in.hidden.dim() != 2 || in.weight.dim() != 2 || in.hidden.size(1) != in.weight.size(1) ||
      !per_position(in.targets) || !per_position(in.old_logprobs) || !per_position(in.advantages) ||
      !per_position(in.reward_weights) ||
      (in.teacher.defined() && !per_position(in.distill_weights))) {
    throw std::invalid_argument(
        "fused head: want hidden [M, D], weight [V, D] and [M] targets, old log-probs, "
        "advantages and weights; got hidden " +
        c10::str(in.hidden.sizes()) + ", weight " + c10::str(in.weight.sizes()));
  }
}

}  // namespace

FusedHeadOutputs ComputeFusedHead(const FusedHeadInputs& in) {
  CheckInputs(in);
  const variable_list out = FusedHeadFunction::apply(in.hidden, in.weight, &in);
  const bool distill = in.teacher.defined();
  FusedHeadOutputs terms;
  terms.reward_loss = out[0];
  if (in.combine) terms.combined_loss = out[2];
  terms.token_logprobs = out[3];
  terms.reward = out[4];
  terms.entropy = out[6];
  if (distill) {
    terms.distill_loss = out[1];
    terms.distill = out[5];
    terms.logit_kernel = out[7];
    if (in.mask) terms.mask_weights = out[8];
  }
  return terms;
}

}  // namespace kappa::learner
