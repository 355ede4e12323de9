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

// Data parallel. Rank r's term is a mean L = s_r / max(c_r, 1) over its own
// c_r tokens (or sequences); the whole batch's mean is Σ s_r / max(C, 1),
// C = Σ c_r. Scaling each rank's term by max(c_r, 1) / max(C, 1) before its
// backward makes the sum of the ranks' gradients the gradient of that mean,
// whatever the split, instead of a mean of per-rank means.
struct RankShares {
  double reward_scale = 1, distill_scale = 1, sft_scale = 1;
  double reward_loss = 0, distill_loss = 0, sft_loss = 0;  // over the whole batch
  bool any_distill = false, any_sft = false;                // on some rank
};

RankShares ShareAcrossRanks(const LossTerms& terms, bool has_distill, bool has_sft,
                            Collectives& collectives) {
  auto count = [](const torch::Tensor& c, bool present) {
    return present && c.defined() ? c.detach().to(torch::kCPU, torch::kFloat64).reshape({})
                                  : torch::zeros({}, torch::kFloat64);
  };
  auto loss = [](const torch::Tensor& l, bool present) {
    return present ? l.detach().to(torch::kCPU, torch::kFloat64).reshape({})
                   : torch::zeros({}, torch::kFloat64);
  };
  const torch::Tensor counts = torch::stack({count(terms.reward_count, true),
                                             count(terms.distill_count, has_distill),
                                             count(terms.sft_count, has_sft)});
  const torch::Tensor losses = torch::stack({loss(terms.reward_loss, true),
                                             loss(terms.distill_loss, has_distill),
                                             loss(terms.sft_loss, has_sft)});
  const torch::Tensor local_weight = counts.clamp_min(1);
  // [c_R, c_D, c_S, s_R, s_D, s_S] summed over ranks; on the group's device.
  const torch::Device device = terms.reward_loss.device();
  torch::Tensor shared = torch::cat({counts, losses * local_weight}).to(device);
  collectives.SumInPlace({shared});
  shared = shared.to(torch::kCPU);
  const double* g = shared.data_ptr<double>();
  const double* local = local_weight.data_ptr<double>();
  RankShares shares;
  const double total_reward = std::max(g[0], 1.0), total_distill = std::max(g[1], 1.0),
               total_sft = std::max(g[2], 1.0);
  shares.reward_scale = local[0] / total_reward;
  shares.distill_scale = local[1] / total_distill;
  shares.sft_scale = local[2] / total_sft;
  shares.reward_loss = g[3] / total_reward;
  shares.distill_loss = g[4] / total_distill;
  shares.sft_loss = g[5] / total_sft;
  shares.any_distill = g[1] > 0;
  shares.any_sft = g[2] > 0;
  return shares;
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

void PolicyOptimizer::set_collectives(Collectives* collectives) {
  collectives_ = collectives;
  if (collectives_ == nullptr || collectives_->size() == 1) return;
  // Every rank starts from rank 0's weights; identical updates keep them so.
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : params_) params.push_back(p.data());
  collectives_->Broadcast(params, /*root=*/0);
}

StepStats PolicyOptimizer::Step(const LossTerms& terms, const GradientPlan& plan, bool separate) {
  StepStats stats;
  auto has_graph = [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); };
  // This rank's graphs...
  const bool has_distill = has_graph(terms.distill_loss);
  const bool has_sft = has_graph(terms.sft_loss) && plan.sft_weight != 0.0;
  const torch::Device device = params_.front().device();
  auto scalar = [&](const torch::Tensor& t) {
    return t.detach().to(device, torch::kFloat64).reshape({});
  };
  // ... and, data parallel, the terms some rank has (a rank without one
  // still sums a zero gradient for it, so the collectives match up). The
  // reported losses are then the whole batch's.
  const bool parallel = collectives_ != nullptr && collectives_->size() > 1;
  RankShares shares;
  shares.any_distill = has_distill;
  shares.any_sft = has_sft;
  std::vector<torch::Tensor> host_values;
  if (parallel) {
    shares = ShareAcrossRanks(terms, has_distill, has_sft, *collectives_);
    for (double loss : {shares.reward_loss, shares.distill_loss, shares.sft_loss}) {
      host_values.push_back(torch::tensor(loss, torch::kFloat64).to(device));
    }
  } else {
    host_values = {scalar(terms.reward_loss), scalar(terms.distill_loss), scalar(terms.sft_loss)};
  }
  const torch::Tensor reward_loss = terms.reward_loss * shares.reward_scale;
  const torch::Tensor distill_loss =
      has_distill ? terms.distill_loss * shares.distill_scale : terms.distill_loss;
  const torch::Tensor sft_loss = has_sft ? terms.sft_loss * shares.sft_scale : terms.sft_loss;
  const bool any_sft = shares.any_sft && plan.sft_weight != 0.0;

  stats.measured = separate || plan.project || plan.normalize;
  if (stats.measured) {
    // One backward per signal, each into its own buffer; the shared graph
    // (the logits) is kept until the last one.
    AttachGradients(reward_grad_, /*zero=*/true);
    reward_loss.backward({}, /*retain_graph=*/has_distill || has_sft);
    GradientList distill(1), sft(1);
    if (shares.any_distill) {
      AttachGradients(distill_grad_, /*zero=*/true);
      if (has_distill) distill_loss.backward({}, /*retain_graph=*/has_sft);
      distill[0] = distill_grad_.flat;
    }
    if (any_sft) {
      AttachGradients(sft_grad_, /*zero=*/true);
      if (has_sft) sft_loss.backward();
      sft[0] = sft_grad_.flat;
    }
    torch::NoGradGuard no_grad;
    if (parallel) {
      std::vector<torch::Tensor> buffers = {reward_grad_.flat};
      if (shares.any_distill) buffers.push_back(distill_grad_.flat);
      if (any_sft) buffers.push_back(sft_grad_.flat);
      collectives_->SumInPlace(buffers);
    }
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
    torch::Tensor total = plan.reward_weight * reward_loss;
    if (has_distill) total = total + plan.distill_weight * distill_loss;
    if (has_sft) total = total + plan.sft_weight * sft_loss;
    total.backward();
    torch::NoGradGuard no_grad;
    if (parallel) collectives_->SumInPlace({reward_grad_.flat});
    host_values.push_back(reward_grad_.flat.to(torch::kFloat64).square().sum());
  }

  // One device→host transfer for every number of the step.
  const torch::Tensor host = torch::stack(host_values).to(torch::kCPU);
  const double* h = host.data_ptr<double>();
  stats.reward_loss = h[0];
  stats.distill_loss = shares.any_distill ? h[1] : 0.0;
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
    // Onto the parameters' device: a CPU checkpoint resumes on a GPU and back.
    archive.load_from(path, params_.front().device());
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
