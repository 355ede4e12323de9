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
  for (const torch::Tensor& p : params) {
    if (p.scalar_type() != params.front().scalar_type() || p.device() != params.front().device()) {
      throw std::invalid_argument(
          "PolicyOptimizer: trainable parameters must share one dtype and device");
    }
  }
  return params;
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

PolicyOptimizer::FlatGradient PolicyOptimizer::MakeFlatGradient() const {
  int64_t total = 0;
  for (const torch::Tensor& p : params_) total += p.numel();
  FlatGradient buffer;
  buffer.flat = torch::zeros({total}, params_.front().options());
  int64_t offset = 0;
  for (const torch::Tensor& p : params_) {
    buffer.views.push_back(buffer.flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return buffer;
}

void PolicyOptimizer::AttachGradients(FlatGradient& buffer, bool zero) {
  const torch::Tensor& first = params_.front();
  if (!buffer.flat.defined() || buffer.flat.device() != first.device() ||
      buffer.flat.scalar_type() != first.scalar_type()) {
    buffer = MakeFlatGradient();
  } else if (zero) {
    buffer.flat.zero_();
  }
  // Backward accumulates in place into an existing .grad, i.e. into the view.
  for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = buffer.views[i];
}

StepStats PolicyOptimizer::Step(const LossTerms& terms, double lambda) {
  GradientPlan plan;
  plan.distill_weight = lambda;
  return Step(terms, plan, /*separate=*/true);
}

StepStats PolicyOptimizer::Step(const LossTerms& terms, const GradientPlan& plan, bool separate) {
  StepStats stats;
  auto has_graph = [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); };
  const bool has_distill = has_graph(terms.distill_loss);
  const bool has_sft = has_graph(terms.sft_loss) && plan.sft_weight != 0.0;
  const torch::Device device = params_.front().device();
  auto scalar = [&](const torch::Tensor& t) {
    return t.detach().to(device, torch::kFloat64).reshape({});
  };
  std::vector<torch::Tensor> host_values = {scalar(terms.reward_loss),
                                            scalar(terms.distill_loss), scalar(terms.sft_loss)};

  stats.measured = separate || plan.project || plan.normalize;
  if (stats.measured) {
    // One backward per signal, each into its own buffer; the shared graph
    // (the logits) is kept until the last one.
    AttachGradients(reward_grad_, /*zero=*/true);
    terms.reward_loss.backward({}, /*retain_graph=*/has_distill || has_sft);
    GradientList distill(1), sft(1);
    if (has_distill) {
      AttachGradients(distill_grad_, /*zero=*/true);
      terms.distill_loss.backward({}, /*retain_graph=*/has_sft);
      distill[0] = distill_grad_.flat;
    }
    if (has_sft) {
      AttachGradients(sft_grad_, /*zero=*/true);
      terms.sft_loss.backward();
      sft[0] = sft_grad_.flat;
    }
    torch::NoGradGuard no_grad;
    // Combines in place into the reward buffer, which becomes .grad.
    const CombinedGradient combined =
        CombineGradients({reward_grad_.flat}, std::move(distill), std::move(sft), plan, device);
    AttachGradients(reward_grad_, /*zero=*/false);
    for (const torch::Tensor& t : {combined.total_sq, combined.reward_sq, combined.distill_sq,
                                   combined.dot, combined.balanced_reward_sq,
                                   combined.distill_scale}) {
      host_values.push_back(scalar(t));
    }
  } else {
    AttachGradients(reward_grad_, /*zero=*/true);
    torch::Tensor total = plan.reward_weight * terms.reward_loss;
    if (has_distill) total = total + plan.distill_weight * terms.distill_loss;
    if (has_sft) total = total + plan.sft_weight * terms.sft_loss;
    total.backward();
    torch::NoGradGuard no_grad;
    host_values.push_back(reward_grad_.flat.to(torch::kFloat64).square().sum());
  }

  // One device→host transfer for every number of the step.
  const torch::Tensor host = torch::stack(host_values).to(torch::kCPU);
  const double* h = host.data_ptr<double>();
  stats.reward_loss = h[0];
  stats.distill_loss = has_distill ? h[1] : 0.0;
  stats.sft_loss = h[2];
  stats.grad_norm = std::sqrt(h[3]);
  if (stats.measured) {
    const double rr = h[4], dd = h[5], rd = h[6];
    stats.reward_grad_norm = std::sqrt(rr);
    stats.distill_grad_norm = std::sqrt(dd);
    stats.grad_cosine = (rr > 0 && dd > 0) ? rd / std::sqrt(rr * dd) : 0.0;
    stats.balanced_reward_grad_norm = std::sqrt(h[7]);
    stats.distill_scale = h[8];
    stats.projected = plan.project && rd < 0 && dd > 0;
  } else {
    stats.distill_scale = plan.distill_weight;
  }
  ClipAndApply(stats.grad_norm, &stats);
  return stats;
}

void PolicyOptimizer::ClipAndApply(double grad_norm, StepStats* stats) {
  if (max_grad_norm_ > 0 && grad_norm > max_grad_norm_) {
    // .grad is a view of reward_grad_ (see AttachGradients).
    reward_grad_.flat.mul_(max_grad_norm_ / (grad_norm + 1e-6));
  }
  stats->lr = LearningRate();
  for (auto& group : optimizer_.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(stats->lr);
  }
  optimizer_.step();
  ++step_;
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
