#include "learner/algo/adamw_in_slices.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace kappa::learner {
namespace {

// The optimizer state's key for `p`: libtorch 1.13 keys by the TensorImpl
// address printed as a string, 2.x by the address itself.
template <typename StateMap>
typename StateMap::key_type StateKey(const StateMap&, const torch::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << static_cast<const void*>(p.unsafeGetTensorImpl());
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace

torch::optim::AdamWParamState& AdamWStateFor(torch::optim::AdamW& optimizer,
                                             const torch::Tensor& p) {
  auto& states = optimizer.state();
  const auto key = StateKey(states, p);
  auto found = states.find(key);
  if (found == states.end()) {
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(0);
    state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    found = states.emplace(key, std::move(state)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*found->second);
}

const torch::optim::AdamWParamState* FindAdamWState(torch::optim::AdamW& optimizer,
                                                    const torch::Tensor& p) {
  auto& states = optimizer.state();
  const auto found = states.find(StateKey(states, p));
  if (found == states.end()) return nullptr;
  return &static_cast<const torch::optim::AdamWParamState&>(*found->second);
}

void AdamWUpdate(torch::Tensor p, const torch::Tensor& g, torch::Tensor m, torch::Tensor v,
                 const torch::optim::AdamWOptions& options, double lr, int64_t step,
                 int64_t slice_elements, torch::Tensor* denom_buffer) {
  const auto [beta1, beta2] = options.betas();
  if (options.weight_decay() != 0) p.mul_(1 - lr * options.weight_decay());
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  m.mul_(beta1).add_(g, 1 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1 - beta2);
  const double step_size = lr / bias_correction1;
  const double sqrt_bias_correction2 = std::sqrt(bias_correction2);

  if (!(p.is_contiguous() && m.is_contiguous() && v.is_contiguous())) {
    // No flat views: libtorch's expression, whole.
    p.addcdiv_(m, (v.sqrt() / sqrt_bias_correction2).add_(options.eps()), -step_size);
    return;
  }
  const int64_t n = p.numel();
  const int64_t width = std::min(n, slice_elements);
  if (!denom_buffer->defined() || denom_buffer->numel() < width ||
      denom_buffer->scalar_type() != v.scalar_type() || denom_buffer->device() != v.device()) {
    *denom_buffer = torch::empty({width}, v.options());
  }
  torch::Tensor p_flat = p.view({-1});
  const torch::Tensor m_flat = m.view({-1});
  const torch::Tensor v_flat = v.view({-1});
  for (int64_t start = 0; start < n; start += width) {
    const int64_t len = std::min(width, n - start);
    torch::Tensor denom = denom_buffer->narrow(0, 0, len);
    torch::sqrt_out(denom, v_flat.narrow(0, start, len));
    denom.div_(sqrt_bias_correction2).add_(options.eps());
    p_flat.narrow(0, start, len).addcdiv_(m_flat.narrow(0, start, len), denom, -step_size);
  }
}

void AdamWStepInSlices(torch::optim::AdamW& optimizer, int64_t slice_elements) {
  if (slice_elements <= 0) {
    throw std::invalid_argument("AdamWStepInSlices: slice_elements must be > 0");
  }
  torch::NoGradGuard no_grad;
  torch::Tensor denom_buffer;  // one slice, reused
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    if (options.amsgrad()) {
      throw std::invalid_argument("AdamWStepInSlices: amsgrad is not implemented");
    }
    for (torch::Tensor& p : group.params()) {
      const torch::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        throw std::invalid_argument("AdamWStepInSlices: a sparse gradient (AdamW takes dense)");
      }
      torch::optim::AdamWParamState& state = AdamWStateFor(optimizer, p);
      state.step(state.step() + 1);
      AdamWUpdate(p, grad, state.exp_avg(), state.exp_avg_sq(), options, options.lr(), state.step(),
                  slice_elements, &denom_buffer);
    }
  }
}

}  // namespace kappa::learner
