#include "learner/algo/fused_token_terms.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "learner/algo/logit_gradients.h"
#include "learner/algo/logprob_losses.h"

#ifdef KAPPA_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "learner/algo/cuda/fused_token_terms.h"
#endif

namespace kappa::learner {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per chunk of the torch-op path: about 4M elements (16 MB in float32),
// so its temporaries stay one chunk, never a second [B, L, V].
constexpr int64_t kChunkElements = int64_t{1} << 22;

int64_t ChunkRows(int64_t vocab) { return std::max<int64_t>(1, kChunkElements / vocab); }

// float32 at least: half-precision logits lose too much in the normalizer.
torch::ScalarType ComputeType(torch::ScalarType logits) {
  return logits == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

struct Forward {
  torch::Tensor logprobs, token_logprobs, reverse_kl, entropy;  // [N, V], [N] ×3
};

// logits, teacher [N, V]; targets [N].
Forward TorchForward(const torch::Tensor& logits, const torch::Tensor& targets,
                     const torch::Tensor& teacher, double temperature) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const auto options = logits.options().dtype(ComputeType(logits.scalar_type()));
  Forward out;
  out.logprobs = torch::empty({rows, vocab}, options);
  out.token_logprobs = torch::empty({rows}, options);
  out.reverse_kl = torch::empty({rows}, options);
  out.entropy = torch::empty({rows}, options);
  const int64_t chunk = ChunkRows(vocab);
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t n = std::min(chunk, rows - start);
    torch::Tensor z = logits.narrow(0, start, n).to(options.dtype());
    if (temperature != 1.0) z = z / temperature;
    // The per-row formulas are the loss code's own, one chunk at a time.
    const torch::Tensor lp = torch::log_softmax(z, -1);
    out.logprobs.narrow(0, start, n).copy_(lp);
    out.token_logprobs.narrow(0, start, n)
        .copy_(GatherTokenLogProbs(lp, targets.narrow(0, start, n)));
    out.reverse_kl.narrow(0, start, n)
        .copy_(ReverseKlFromLogProbs(lp, teacher.narrow(0, start, n).to(lp.scalar_type())));
    out.entropy.narrow(0, start, n).copy_(EntropyFromLogProbs(lp));
  }
  return out;
}

// grad_token, grad_kl: [N] or undefined. Returns [N, V] in `dtype`: the
// closed-form logit gradients of logit_gradients.h (the ones K_DR uses),
// weighted by the incoming gradients, one chunk at a time.
torch::Tensor TorchBackward(const torch::Tensor& logprobs, const torch::Tensor& teacher,
                            const torch::Tensor& targets, const torch::Tensor& grad_token,
                            const torch::Tensor& grad_kl, double temperature,
                            torch::ScalarType dtype) {
  const int64_t rows = logprobs.size(0), vocab = logprobs.size(1);
  torch::Tensor grad = torch::empty({rows, vocab}, logprobs.options().dtype(dtype));
  const int64_t chunk = ChunkRows(vocab);
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t n = std::min(chunk, rows - start);
    const torch::Tensor lp = logprobs.narrow(0, start, n);
    const torch::Tensor y = targets.narrow(0, start, n);
    torch::Tensor g;
    if (grad_kl.defined()) {
      g = DistillLogitGradient(lp,
                               TeacherRows{teacher.narrow(0, start, n).to(lp.scalar_type()), {}}, y,
                               DistillLoss::kReverseKl, temperature) *
          grad_kl.narrow(0, start, n).unsqueeze(-1).to(lp.scalar_type());
    }
    if (grad_token.defined()) {
      const torch::Tensor t = RewardLogitGradient(
          lp, y, grad_token.narrow(0, start, n).to(lp.scalar_type()), temperature);
      g = g.defined() ? g + t : t;
    }
    grad.narrow(0, start, n).copy_(g);
  }
  return grad;
}

#ifdef KAPPA_CUDA
bool KernelSupports(const torch::Tensor& logits) {
  return logits.is_cuda() && (logits.scalar_type() == torch::kFloat32 ||
                              logits.scalar_type() == torch::kBFloat16);
}

kappa_logits_dtype KernelDtype(torch::ScalarType t) {
  return t == torch::kBFloat16 ? KAPPA_LOGITS_BFLOAT16 : KAPPA_LOGITS_FLOAT32;
}

void CheckCuda(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, what, ": ", cudaGetErrorString(status));
}

// logits [N, V] contiguous float/bf16 on CUDA; teacher [N, V] contiguous
// float32; targets [N] contiguous int64.
Forward KernelForward(const torch::Tensor& logits, const torch::Tensor& targets,
                      const torch::Tensor& teacher, double temperature) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const auto options = logits.options().dtype(torch::kFloat32);
  Forward out;
  out.logprobs = torch::empty({rows, vocab}, options);
  out.token_logprobs = torch::empty({rows}, options);
  out.reverse_kl = torch::empty({rows}, options);
  out.entropy = torch::empty({rows}, options);
  CheckCuda(kappa_fused_token_terms_forward(
                logits.data_ptr(), KernelDtype(logits.scalar_type()),
                targets.data_ptr<int64_t>(), teacher.data_ptr<float>(), rows, vocab,
                static_cast<float>(temperature), out.logprobs.data_ptr<float>(),
                out.token_logprobs.data_ptr<float>(), out.reverse_kl.data_ptr<float>(),
                out.entropy.data_ptr<float>(),
                c10::cuda::getCurrentCUDAStream(logits.device().index()).stream()),
            "fused token terms forward kernel");
  return out;
}

torch::Tensor KernelBackward(const torch::Tensor& logprobs, const torch::Tensor& teacher,
                             const torch::Tensor& targets, const torch::Tensor& reverse_kl,
                             const torch::Tensor& grad_token, const torch::Tensor& grad_kl,
                             double temperature, torch::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(logprobs.device());
  const int64_t rows = logprobs.size(0), vocab = logprobs.size(1);
  torch::Tensor grad = torch::empty({rows, vocab}, logprobs.options().dtype(dtype));
  const torch::Tensor g_tok =
      grad_token.defined() ? grad_token.to(torch::kFloat32).contiguous() : torch::Tensor();
  const torch::Tensor g_kl =
      grad_kl.defined() ? grad_kl.to(torch::kFloat32).contiguous() : torch::Tensor();
  CheckCuda(kappa_fused_token_terms_backward(
                logprobs.data_ptr<float>(), teacher.data_ptr<float>(),
                targets.data_ptr<int64_t>(), reverse_kl.data_ptr<float>(),
                g_tok.defined() ? g_tok.data_ptr<float>() : nullptr,
                g_kl.defined() ? g_kl.data_ptr<float>() : nullptr, rows, vocab,
                static_cast<float>(temperature), grad.data_ptr(), KernelDtype(dtype),
                c10::cuda::getCurrentCUDAStream(logprobs.device().index()).stream()),
            "fused token terms backward kernel");
  return grad;
}
#endif  // KAPPA_CUDA

// Inputs flattened to [N, V] / [N]. Outputs: token log-probs, reverse KL
// (differentiable), entropy, log-probs (not). Saves the log-probs, the
// reverse KL ([N]), the targets and the teacher (already held by the caller).
class FusedTokenTermsFunction : public torch::autograd::Function<FusedTokenTermsFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, const torch::Tensor& teacher,
                               double temperature, bool use_kernel) {
    Forward out;
#ifdef KAPPA_CUDA
    if (use_kernel) out = KernelForward(logits, targets, teacher, temperature);
#endif
    if (!out.logprobs.defined()) out = TorchForward(logits, targets, teacher, temperature);
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["use_kernel"] = use_kernel;
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    ctx->save_for_backward({out.logprobs, out.reverse_kl, targets, teacher});
    ctx->mark_non_differentiable({out.entropy, out.logprobs});
    // The L_R and L_D passes each bring one gradient; the other stays undefined.
    ctx->set_materialize_grads(false);
    return {out.token_logprobs, out.reverse_kl, out.entropy, out.logprobs};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& logprobs = saved[0];
    const torch::Tensor& targets = saved[2];
    const torch::Tensor& teacher = saved[3];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const torch::Tensor& grad_token = grads[0];
    const torch::Tensor& grad_kl = grads[1];
    torch::Tensor grad_logits;
    if (grad_token.defined() || grad_kl.defined()) {
#ifdef KAPPA_CUDA
      if (ctx->saved_data["use_kernel"].toBool()) {
        // saved[1]: the reverse KL per row, which the kernel's closed form reads.
        grad_logits = KernelBackward(logprobs, teacher, targets, saved[1], grad_token, grad_kl,
                                     temperature, dtype);
      }
#endif
      if (!grad_logits.defined()) {
        grad_logits =
            TorchBackward(logprobs, teacher, targets, grad_token, grad_kl, temperature, dtype);
      }
    }
    return {grad_logits, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool FusedTokenTermsHasCudaKernels() {
#ifdef KAPPA_CUDA
  return true;
#else
  return false;
#endif
}

FusedTokenTerms ComputeFusedTokenTerms(const torch::Tensor& logits, const torch::Tensor& targets,
                                       const torch::Tensor& teacher_logprobs, double temperature,
                                       FusedImpl impl) {
  if (!(temperature > 0)) {
    throw std::invalid_argument("ComputeFusedTokenTerms: temperature must be > 0, got " +
                                std::to_string(temperature));
  }
  if (logits.dim() < 1 || !logits.is_floating_point() || logits.size(-1) == 0) {
    throw std::invalid_argument("ComputeFusedTokenTerms: logits must be floating [..., V], V > 0, got " +
                                c10::str(logits.sizes()));
  }
  if (teacher_logprobs.sizes() != logits.sizes() || !teacher_logprobs.is_floating_point()) {
    throw std::invalid_argument("ComputeFusedTokenTerms: teacher log-probs " +
                                c10::str(teacher_logprobs.sizes()) +
                                " do not match student logits " + c10::str(logits.sizes()));
  }
  if (targets.sizes() != logits.sizes().slice(0, logits.dim() - 1)) {
    throw std::invalid_argument("ComputeFusedTokenTerms: targets " + c10::str(targets.sizes()) +
                                " do not match logits " + c10::str(logits.sizes()));
  }
  if (targets.device() != logits.device() || teacher_logprobs.device() != logits.device()) {
    throw std::invalid_argument("ComputeFusedTokenTerms: logits on " + logits.device().str() +
                                ", targets on " + targets.device().str() + ", teacher on " +
                                teacher_logprobs.device().str());
  }
  const int64_t vocab = logits.size(-1);
  bool use_kernel = false;
#ifdef KAPPA_CUDA
  use_kernel = impl == FusedImpl::kAuto && KernelSupports(logits);
#endif
  (void)impl;
  // The kernel reads dense float32 teacher rows; the torch path takes the
  // teacher as it is (a float32 teacher under float64 logits promotes there).
  const torch::Tensor teacher =
      use_kernel ? teacher_logprobs.detach().to(torch::kFloat32).contiguous().reshape({-1, vocab})
                 : teacher_logprobs.detach().reshape({-1, vocab});
  const torch::Tensor flat_logits =
      use_kernel ? logits.contiguous().reshape({-1, vocab}) : logits.reshape({-1, vocab});
  const torch::Tensor flat_targets = targets.to(torch::kInt64).contiguous().reshape({-1});
  const variable_list out = FusedTokenTermsFunction::apply(flat_logits, flat_targets, teacher,
                                                          temperature, use_kernel);
  const auto rows_shape = targets.sizes();
  FusedTokenTerms terms;
  terms.token_logprobs = out[0].view(rows_shape);
  terms.reverse_kl = out[1].view(rows_shape);
  terms.entropy = out[2].view(rows_shape);
  terms.logprobs = out[3].view(logits.sizes());
  return terms;
}

}  // namespace kappa::learner
