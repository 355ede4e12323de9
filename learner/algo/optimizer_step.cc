#include "learner/algo/optimizer_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <unistd.h>

namespace kappa::learner {
namespace {

std::vector<torch::Tensor> TrainableParameters(model::Decoder& model) {
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : model->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (params.empty()) throw std::invalid_argument("PolicyOptimizer: no trainable parameters");
  return params;
}

// Σ_i fn(i) over the parameters whose tensors in `a` are defined, as a
// float64 scalar on `device`, so the whole step syncs with the host once.
template <typename Fn>
torch::Tensor SumOver(const std::vector<torch::Tensor>& a, const torch::Device& device, Fn fn) {
  std::vector<torch::Tensor> parts;
  parts.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined()) parts.push_back(fn(i).to(torch::kFloat64));
  }
  if (parts.empty()) return torch::zeros({}, torch::TensorOptions(device).dtype(torch::kFloat64));
  return torch::stack(parts).sum();
}

torch::Tensor SquaredNorm(const std::vector<torch::Tensor>& a, const torch::Device& device) {
  return SumOver(a, device, [&](size_t i) { return a[i].square().sum(); });
}

}  // namespace

PolicyOptimizer::PolicyOptimizer(model::Decoder model, double lr, double weight_decay,
                                 double max_grad_norm, int64_t warmup_steps)
    : model_(std::move(model)),
      params_(TrainableParameters(model_)),
      optimizer_(params_, torch::optim::AdamWOptions(lr).weight_decay(weight_decay)),
      base_lr_(lr),
      max_grad_norm_(max_grad_norm),
      warmup_steps_(std::max<int64_t>(0, warmup_steps)) {}

double PolicyOptimizer::LearningRate() const {
  if (warmup_steps_ == 0 || step_ >= warmup_steps_) return base_lr_;
  return base_lr_ * static_cast<double>(step_ + 1) / static_cast<double>(warmup_steps_);
}

StepStats PolicyOptimizer::Step(const LossTerms& terms, double lambda) {
  StepStats stats;
  for (torch::Tensor& p : params_) p.mutable_grad() = torch::Tensor();

  const bool has_distill = terms.distill_loss.defined() && terms.distill_loss.requires_grad();
  // The distillation backward still needs the shared graph (logits).
  terms.reward_loss.backward({}, /*retain_graph=*/has_distill);
  // Move ∇L_R aside (no copy) so the second backward lands in fresh buffers.
  std::vector<torch::Tensor> reward_grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    reward_grads[i] = params_[i].grad();
    params_[i].mutable_grad() = torch::Tensor();
  }
  std::vector<torch::Tensor> distill_grads(params_.size());
  if (has_distill) {
    terms.distill_loss.backward();
    for (size_t i = 0; i < params_.size(); ++i) distill_grads[i] = params_[i].grad();
  }

  torch::NoGradGuard no_grad;
  const torch::Device device = params_.front().device();
  const torch::Tensor rr = SquaredNorm(reward_grads, device);
  const torch::Tensor dd = SquaredNorm(distill_grads, device);
  std::vector<torch::Tensor> paired(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (reward_grads[i].defined() && distill_grads[i].defined()) paired[i] = reward_grads[i];
  }
  const torch::Tensor rd = SumOver(
      paired, device, [&](size_t i) { return (reward_grads[i] * distill_grads[i]).sum(); });

  // g = g_R + λ g_D into .grad, reusing the distillation buffers.
  std::vector<torch::Tensor> grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor g = reward_grads[i];
    if (distill_grads[i].defined()) {
      g = distill_grads[i].mul_(lambda);
      if (reward_grads[i].defined()) g.add_(reward_grads[i]);
    }
    params_[i].mutable_grad() = g;
    grads[i] = g;
  }
  const torch::Tensor total_sq = SquaredNorm(grads, device);

  auto scalar = [&](const torch::Tensor& t) { return t.detach().to(device, torch::kFloat64).reshape({}); };
  const torch::Tensor host =
      torch::stack({scalar(terms.reward_loss),
                    has_distill ? scalar(terms.distill_loss) : torch::zeros_like(rr), rr, dd,
                    rd, total_sq})
          .to(torch::kCPU);
  const double* h = host.data_ptr<double>();
  stats.reward_loss = h[0];
  stats.distill_loss = h[1];
  stats.reward_grad_norm = std::sqrt(h[2]);
  stats.distill_grad_norm = std::sqrt(h[3]);
  stats.grad_cosine = (h[2] > 0 && h[3] > 0) ? h[4] / std::sqrt(h[2] * h[3]) : 0.0;
  stats.grad_norm = std::sqrt(h[5]);

  if (max_grad_norm_ > 0 && stats.grad_norm > max_grad_norm_) {
    const double scale = max_grad_norm_ / (stats.grad_norm + 1e-6);
    for (torch::Tensor& p : params_) {
      if (p.grad().defined()) p.mutable_grad().mul_(scale);
    }
  }
  stats.lr = LearningRate();
  for (auto& group : optimizer_.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(stats.lr);
  }
  optimizer_.step();
  ++step_;
  return stats;
}

void PolicyOptimizer::Save(const std::string& path) const {
  torch::serialize::OutputArchive archive;
  optimizer_.save(archive);
  archive.write("kappa_policy_optimizer_step", torch::tensor(step_));
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  archive.save_to(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("PolicyOptimizer::Save: cannot rename " + tmp + " to " + path);
  }
}

void PolicyOptimizer::Load(const std::string& path) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
    optimizer_.load(archive);
    torch::Tensor step;
    archive.read("kappa_policy_optimizer_step", step);
    step_ = step.item<int64_t>();
  } catch (const c10::Error& e) {
    throw std::runtime_error("PolicyOptimizer::Load: cannot read optimizer state from " + path +
                             ": " + e.what_without_backtrace());
  }
}

}  // namespace kappa::learner
