#include "learner/algo/vocab_head.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "learner/algo/logit_gradients.h"
#include "learner/algo/logprob_losses.h"
#include "model/autocast_state.h"

namespace kappa::learner {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the node reduces over the vocabulary itself: the full-vocabulary
// KLs. Every other loss is formed outside it from small tensors.
enum class FullKl : int64_t { kNone, kReverse, kForward };

FullKl FullKlOf(DistillLoss loss, const TeacherRows& teacher, const torch::Tensor& targets) {
  if (!teacher.defined() || !teacher.full(targets)) return FullKl::kNone;
  if (loss == DistillLoss::kReverseKl) return FullKl::kReverse;
  if (loss == DistillLoss::kForwardKl) return FullKl::kForward;
  return FullKl::kNone;
}

// float32 at least: half-precision logits lose too much in the normalizer.
torch::ScalarType ComputeType(torch::ScalarType hidden) {
  return hidden == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// One chunk's scaled logits s = h W^T / τ in the compute type. The product
// runs in the hidden states' type (bfloat16 under autocast), as the model's
// own output projection would: `weight` is already in that type.
torch::Tensor ScaledLogits(const torch::Tensor& hidden_chunk, const torch::Tensor& weight,
                           double temperature) {
  const torch::Tensor z =
      torch::matmul(hidden_chunk, weight.t()).to(ComputeType(hidden_chunk.scalar_type()));
  return temperature == 1.0 ? z : z / temperature;
}

// The teacher's log q for one chunk of positions: a slice of the full rows
// [N, V] it was sent, or the teacher's head applied to a slice of its
// hidden rows [N, D_t] (the hidden form: no [N, V] teacher tensor exists).
struct TeacherChunks {
  torch::Tensor full;    // [N, V] log q, or empty
  torch::Tensor hidden;  // [N, D_t], or empty
  TeacherHead head;      // with hidden

  // log q [n, V] of rows [start, start + n), in the compute type of `like`.
  torch::Tensor LogProbs(int64_t start, int64_t n, const torch::Tensor& like) const {
    const torch::Tensor q = head.defined() && head.weight.numel() > 0
                                ? head.LogProbs(hidden.narrow(0, start, n))
                                : full.narrow(0, start, n);
    return q.to(like.scalar_type());
  }
};

// What the node's forward keeps for its backward, by name: the inputs the
// backward recomputes each chunk's logits from, and the settings it
// recomputes them with.
struct SavedForBackward {
  torch::Tensor hidden;          // [N, D]
  torch::Tensor weight;          // [V, D]
  torch::Tensor targets;         // [N]
  torch::Tensor full_teacher;    // [N, V] log q for a full KL from full rows, else empty
  torch::Tensor teacher_hidden;  // [N, D_t] for a full KL from hidden rows, else empty
  torch::Tensor teacher_weight;  // [V, D_t] the teacher's head with teacher_hidden, else empty
  torch::Tensor topk_ids;        // [N, k] for the top-k losses, else empty (1-D)
  FullKl full_kl = FullKl::kNone;
  double temperature = 1.0;
  int64_t chunk = 1;
  // The backward recomputes the logits under the same autocast state, so
  // it differentiates the function the forward evaluated.
  model::AutocastState autocast;

  void SaveTo(AutogradContext* ctx) const {
    ctx->save_for_backward(
        {hidden, weight, targets, full_teacher, teacher_hidden, teacher_weight, topk_ids});
    ctx->saved_data["full_kl"] = static_cast<int64_t>(full_kl);
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["autocast"] = autocast.Encode();
  }

  // The inverse of SaveTo.
  static SavedForBackward LoadFrom(AutogradContext* ctx) {
    const variable_list tensors = ctx->get_saved_variables();
    SavedForBackward saved;
    saved.hidden = tensors[0];
    saved.weight = tensors[1];
    saved.targets = tensors[2];
    saved.full_teacher = tensors[3];
    saved.teacher_hidden = tensors[4];
    saved.teacher_weight = tensors[5];
    saved.topk_ids = tensors[6];
    saved.full_kl = static_cast<FullKl>(ctx->saved_data["full_kl"].toInt());
    saved.temperature = ctx->saved_data["temperature"].toDouble();
    saved.chunk = ctx->saved_data["chunk"].toInt();
    saved.autocast = model::AutocastState::Decode(ctx->saved_data["autocast"].toInt());
    return saved;
  }

  TeacherChunks teacher() const {
    return {full_teacher, teacher_hidden, TeacherHead{teacher_weight}};
  }
};

// The node's outputs, by name: logsumexp(s) [N], s at the target [N], s at
// the top-k ids [N, k] (or empty), the full KL [N] (or empty), the entropy
// [N] (no gradient). The incoming gradients come in the same order.
struct HeadOutputs {
  torch::Tensor lse, target_logit, set_logits, kl, entropy;

  variable_list ToList() const { return {lse, target_logit, set_logits, kl, entropy}; }
  static HeadOutputs FromList(const variable_list& list) {
    return {list[0], list[1], list[2], list[3], list[4]};
  }
};

// Inputs: hidden [N, D], weight [V, D] (differentiable), targets [N], for a
// full KL either the teacher's log-probs [N, V] or its hidden rows [N, D_t]
// and head [V, D_t] (the others empty), top-k ids ([N, k], else empty).
// Outputs: HeadOutputs::ToList().
class VocabHeadFunction : public torch::autograd::Function<VocabHeadFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets,
                               const torch::Tensor& full_teacher,
                               const torch::Tensor& teacher_hidden,
                               const torch::Tensor& teacher_weight, const torch::Tensor& topk_ids,
                               int64_t full_kl, double temperature, int64_t chunk) {
    torch::NoGradGuard no_grad;
    const int64_t rows = hidden.size(0);
    const auto options = hidden.options().dtype(ComputeType(hidden.scalar_type()));
    // [N, k] ids (N may be 0: a micro-batch with no trainable position);
    // the placeholder for no ids is 1-D.
    const bool with_set = topk_ids.dim() == 2;
    const auto kl_kind = static_cast<FullKl>(full_kl);
    HeadOutputs out;
    out.lse = torch::empty({rows}, options);
    out.target_logit = torch::empty({rows}, options);
    out.set_logits =
        with_set ? torch::empty({rows, topk_ids.size(1)}, options) : torch::empty({0}, options);
    out.kl = kl_kind != FullKl::kNone ? torch::empty({rows}, options) : torch::empty({0}, options);
    out.entropy = torch::empty({rows}, options);
    const torch::Tensor w = weight.to(hidden.scalar_type());
    const TeacherChunks teacher{full_teacher, teacher_hidden, TeacherHead{teacher_weight}};
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t n = std::min(chunk, rows - start);
      const torch::Tensor s = ScaledLogits(hidden.narrow(0, start, n), w, temperature);
      const torch::Tensor chunk_lse = s.logsumexp(-1);
      const torch::Tensor lp = s - chunk_lse.unsqueeze(-1);
      out.lse.narrow(0, start, n).copy_(chunk_lse);
      out.target_logit.narrow(0, start, n)
          .copy_(s.gather(-1, targets.narrow(0, start, n).unsqueeze(-1)).squeeze(-1));
      if (with_set)
        out.set_logits.narrow(0, start, n).copy_(s.gather(-1, topk_ids.narrow(0, start, n)));
      if (kl_kind != FullKl::kNone) {
        const torch::Tensor q = teacher.LogProbs(start, n, lp);
        out.kl.narrow(0, start, n)
            .copy_(kl_kind == FullKl::kReverse ? ReverseKlFromLogProbs(lp, q)
                                               : ForwardKlFromLogProbs(lp, q));
      }
      out.entropy.narrow(0, start, n).copy_(EntropyFromLogProbs(lp));
    }
    SavedForBackward saved;
    saved.hidden = hidden;
    saved.weight = weight;
    saved.targets = targets;
    saved.full_teacher = full_teacher;
    saved.teacher_hidden = teacher_hidden;
    saved.teacher_weight = teacher_weight;
    saved.topk_ids = topk_ids;
    saved.full_kl = kl_kind;
    saved.temperature = temperature;
    saved.chunk = chunk;
    saved.autocast = model::AutocastState::Current(hidden.device().type());
    saved.SaveTo(ctx);
    ctx->mark_non_differentiable({out.entropy});
    // The L_R and L_D passes each bring some of the gradients, never all.
    ctx->set_materialize_grads(false);
    return out.ToList();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedForBackward saved = SavedForBackward::LoadFrom(ctx);
    const HeadOutputs g = HeadOutputs::FromList(grads);
    auto given = [](const torch::Tensor& t) { return t.defined() && t.numel() > 0; };
    // One gradient per forward input: hidden, weight, then none for the rest.
    auto input_grads = [](const torch::Tensor& hidden, const torch::Tensor& weight) {
      return variable_list{hidden, weight, {}, {}, {}, {}, {}, {}, {}, {}};
    };
    if (!g.lse.defined() && !g.target_logit.defined() && !given(g.set_logits) && !given(g.kl)) {
      return input_grads({}, {});
    }

    torch::NoGradGuard no_grad;
    const model::AutocastScope forward_autocast(saved.hidden.device().type(), saved.autocast);
    const int64_t rows = saved.hidden.size(0);
    torch::Tensor grad_hidden = torch::empty_like(saved.hidden);
    // A frozen output weight (student.lora: the head is never a target) gets
    // no [V, D] gradient at all.
    const bool weight_trains = ctx->needs_input_grad(1);
    torch::Tensor grad_weight = weight_trains ? torch::zeros_like(saved.weight) : torch::Tensor();
    const torch::Tensor w = saved.weight.to(saved.hidden.scalar_type());
    const TeacherChunks teacher = saved.teacher();
    for (int64_t start = 0; start < rows; start += saved.chunk) {
      const int64_t n = std::min(saved.chunk, rows - start);
      const torch::Tensor h = saved.hidden.narrow(0, start, n);
      auto part = [&](const torch::Tensor& t) {
        return given(t) ? t.narrow(0, start, n) : torch::Tensor();
      };
      const torch::Tensor s = ScaledLogits(h, w, saved.temperature);
      const torch::Tensor ds = VocabHeadChunkLogitGradient(
          s, {part(g.lse), part(g.target_logit), part(g.set_logits), part(g.kl)},
          saved.targets.narrow(0, start, n), part(saved.topk_ids),
          given(g.kl) ? teacher.LogProbs(start, n, s) : torch::Tensor(),
          saved.full_kl == FullKl::kReverse);
      // s = z / τ and z = h W^T.
      const torch::Tensor dz =
          (saved.temperature == 1.0 ? ds : ds / saved.temperature).to(h.scalar_type());
      grad_hidden.narrow(0, start, n).copy_(torch::matmul(dz, w));
      if (weight_trains) grad_weight += torch::matmul(dz.t(), h).to(grad_weight.scalar_type());
    }
    return input_grads(grad_hidden, grad_weight);
  }
};

// Hidden teacher rows [N, D_t] with a head [V, D_t] over the student's V ids,
// for a loss that reads the full distribution.
void CheckHiddenTeacher(const VocabHeadInputs& in, int64_t rows, int64_t vocab) {
  const TeacherRows& t = in.teacher;
  if (IsTopkLoss(in.distill)) {
    throw std::invalid_argument(
        "vocab head: teacher hidden rows give the exact distribution; use reverse_kl, "
        "forward_kl or sampled_reverse_kl, not a top-k loss");
  }
  if (!t.head.defined() || t.head.weight.dim() != 2) {
    throw std::invalid_argument("vocab head: teacher hidden rows need the teacher's head");
  }
  if (t.hidden.dim() != 2 || t.hidden.size(0) != rows || t.hidden.size(1) != t.head.hidden_size() ||
      t.head.vocab() != vocab) {
    throw std::invalid_argument("vocab head: teacher hidden rows " + c10::str(t.hidden.sizes()) +
                                " and head " + c10::str(t.head.weight.sizes()) + " do not match " +
                                std::to_string(rows) + " positions over " + std::to_string(vocab) +
                                " ids (want [N, D_t] and [V, D_t])");
  }
}

void CheckInputs(const VocabHeadInputs& in) {
  if (!(in.temperature > 0)) {
    throw std::invalid_argument("vocab head: temperature must be > 0, got " +
                                std::to_string(in.temperature));
  }
  if (in.chunk_positions <= 0) {
    throw std::invalid_argument(
        "trainer.vocab_chunk_positions must be > 0 for the chunked "
        "vocabulary head, got " +
        std::to_string(in.chunk_positions));
  }
  if (in.hidden.dim() != 2 || in.weight.dim() != 2 || in.hidden.size(1) != in.weight.size(1) ||
      in.targets.dim() != 1 || in.targets.size(0) != in.hidden.size(0)) {
    throw std::invalid_argument("vocab head: want hidden [N, D], weight [V, D], targets [N]; got " +
                                c10::str(in.hidden.sizes()) + ", " + c10::str(in.weight.sizes()) +
                                ", " + c10::str(in.targets.sizes()));
  }
  const TeacherRows& t = in.teacher;
  if (!t.defined()) return;
  const int64_t rows = in.hidden.size(0), vocab = in.weight.size(0);
  if (t.hidden_form()) {
    CheckHiddenTeacher(in, rows, vocab);
    return;
  }
  const bool full_shape = t.logprobs.dim() == 2 && t.logprobs.size(1) == vocab;
  const bool ok = t.logprobs.size(0) == rows &&
                  (t.topk() ? IsTopkLoss(in.distill) && t.topk_ids.sizes() == t.logprobs.sizes() &&
                                  t.logprobs.dim() == 2
                            : (in.distill == DistillLoss::kSampledReverseKl
                                   ? t.logprobs.dim() == 1 || full_shape
                                   : !IsTopkLoss(in.distill) && full_shape));
  if (!ok) {
    throw std::invalid_argument(
        "vocab head: teacher log-probs " + c10::str(t.logprobs.sizes()) +
        (t.topk() ? " (top-k)" : "") + " cannot feed this distillation loss over " +
        std::to_string(rows) + " positions and " + std::to_string(vocab) +
        " ids (full rows [N, V] for reverse_kl/forward_kl, top-k rows for the top-k losses, "
        "[N] or [N, V] for sampled_reverse_kl)");
  }
}

// VocabHeadChunkLogitGradient's REQUIRES.
void CheckChunkGradientInputs(const torch::Tensor& s, const VocabHeadOutputGrads& g,
                              const torch::Tensor& targets, const torch::Tensor& topk_ids,
                              const torch::Tensor& full_teacher) {
  auto refuse = [&](const std::string& what, const torch::Tensor& got) {
    throw std::invalid_argument("VocabHeadChunkLogitGradient: want " + what + " for logits " +
                                c10::str(s.sizes()) + ", got " +
                                (got.defined() ? c10::str(got.sizes()) : "none"));
  };
  if (s.dim() != 2) refuse("logits s [n, V]", s);
  const int64_t n = s.size(0);
  if (!targets.defined() || targets.dim() != 1 || targets.size(0) != n ||
      targets.scalar_type() != torch::kInt64) {
    refuse("targets [n] int64", targets);
  }
  if (g.set.defined() && (!topk_ids.defined() || topk_ids.dim() != 2 || topk_ids.size(0) != n ||
                          topk_ids.scalar_type() != torch::kInt64)) {
    refuse("topk_ids [n, k] int64 with a gradient at the top-k ids", topk_ids);
  }
  if (g.kl.defined() && (!full_teacher.defined() || full_teacher.sizes() != s.sizes())) {
    refuse("full_teacher [n, V] with a gradient of the full KL", full_teacher);
  }
}

}  // namespace

torch::Tensor VocabHeadChunkLogitGradient(const torch::Tensor& s, const VocabHeadOutputGrads& g,
                                          const torch::Tensor& targets,
                                          const torch::Tensor& topk_ids,
                                          const torch::Tensor& full_teacher, bool reverse_kl) {
  CheckChunkGradientInputs(s, g, targets, topk_ids, full_teacher);
  // p from the logits' own logsumexp: each row sums to 1 whatever rounding
  // the logits took.
  const torch::Tensor lp = s - s.logsumexp(-1, /*keepdim=*/true);
  const torch::Tensor p = lp.exp();
  torch::Tensor ds = torch::zeros_like(s);
  if (g.lse.defined()) ds += g.lse.unsqueeze(-1).to(ds.scalar_type()) * p;
  if (g.target.defined()) {
    ds.scatter_add_(-1, targets.unsqueeze(-1), g.target.unsqueeze(-1).to(ds.scalar_type()));
  }
  if (g.set.defined()) ds.scatter_add_(-1, topk_ids, g.set.to(ds.scalar_type()));
  if (g.kl.defined()) {
    const torch::Tensor q = full_teacher.to(lp.scalar_type());
    const torch::Tensor form =
        reverse_kl ? p * (lp - q - ReverseKlFromLogProbs(lp, q).unsqueeze(-1)) : p - q.exp();
    ds += g.kl.unsqueeze(-1).to(ds.scalar_type()) * form;
  }
  return ds;
}

VocabHeadTerms ComputeVocabHeadTerms(const VocabHeadInputs& in) {
  CheckInputs(in);
  const TeacherRows& teacher = in.teacher;
  const FullKl full_kl = FullKlOf(in.distill, teacher, in.targets);
  const torch::Tensor none = torch::empty({0}, in.targets.options());
  const bool kl_from_rows = full_kl != FullKl::kNone && !teacher.hidden_form();
  const bool kl_from_hidden = full_kl != FullKl::kNone && teacher.hidden_form();
  const HeadOutputs out = HeadOutputs::FromList(VocabHeadFunction::apply(
      in.hidden, in.weight, in.targets, kl_from_rows ? teacher.logprobs.detach() : none,
      kl_from_hidden ? teacher.hidden.detach() : none,
      kl_from_hidden ? teacher.head.weight.detach() : none,
      teacher.topk() ? teacher.topk_ids : none, static_cast<int64_t>(full_kl), in.temperature,
      in.chunk_positions));
  const torch::Tensor &lse = out.lse, &set_logits = out.set_logits;

  VocabHeadTerms terms;
  terms.token_logprobs = out.target_logit - lse;
  terms.entropy = out.entropy;
  if (!teacher.defined()) return terms;
  const torch::Tensor q = teacher.hidden_form() ? torch::Tensor() : teacher.logprobs.detach();
  switch (in.distill) {
    case DistillLoss::kReverseKl:
    case DistillLoss::kForwardKl:
      terms.distill = out.kl;
      break;
    case DistillLoss::kSampledReverseKl:
      terms.distill = SampledReverseKlTokenLoss(terms.token_logprobs,
                                                teacher.TargetLogProbs(in.targets).detach())
                          .to(terms.token_logprobs.scalar_type());
      break;
    case DistillLoss::kTopkReverseKl:
      // The renormalisation on the set makes the logsumexp cancel.
      terms.distill = TopkReverseKl(set_logits, q.to(set_logits.scalar_type()));
      break;
    case DistillLoss::kTopkTailReverseKl:
      terms.distill = TopkTailReverseKl(set_logits - lse.unsqueeze(-1),
                                        q.to(set_logits.scalar_type()), teacher.tail_logmass);
      break;
  }
  return terms;
}

torch::Tensor VocabHeadLogitKernel(const VocabHeadInputs& in,
                                   const torch::Tensor& reward_coefficient) {
  CheckInputs(in);
  if (!in.teacher.defined()) {
    throw std::invalid_argument("VocabHeadLogitKernel: requires teacher rows (in.teacher)");
  }
  if (reward_coefficient.dim() != 1 || reward_coefficient.size(0) != in.hidden.size(0)) {
    throw std::invalid_argument(
        "VocabHeadLogitKernel: requires reward_coefficient [N] for hidden " +
        c10::str(in.hidden.sizes()) + ", got " + c10::str(reward_coefficient.sizes()));
  }
  torch::NoGradGuard no_grad;
  // The loss's own logits: the product under the autocast state the loss's
  // forward ran the head under (bfloat16 under trainer.precision bf16), so
  // K_DR and m3_mask judge the gradients the step applies.
  const model::AutocastScope loss_autocast(in.hidden.device().type(), in.autocast);
  const torch::Tensor hidden = in.hidden.detach();
  const torch::Tensor weight = in.weight.detach().to(hidden.scalar_type());
  const int64_t rows = hidden.size(0);
  torch::Tensor kernel =
      torch::empty({rows}, hidden.options().dtype(ComputeType(hidden.scalar_type())));
  for (int64_t start = 0; start < rows; start += in.chunk_positions) {
    const int64_t n = std::min(in.chunk_positions, rows - start);
    const torch::Tensor lp =
        torch::log_softmax(ScaledLogits(hidden.narrow(0, start, n), weight, in.temperature), -1);
    const torch::Tensor y = in.targets.narrow(0, start, n);
    const torch::Tensor g_r = RewardLogitGradient(
        lp, y, reward_coefficient.narrow(0, start, n).to(lp.scalar_type()), in.temperature);
    const torch::Tensor g_d =
        DistillLogitGradient(lp, in.teacher.Narrow(start, n), y, in.distill, in.temperature);
    kernel.narrow(0, start, n).copy_((g_r * g_d).sum(-1));
  }
  return kernel;
}

}  // namespace kappa::learner
