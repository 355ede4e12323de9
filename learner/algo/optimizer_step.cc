#include "learner/algo/optimizer_step.h"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "learner/algo/adamw_in_slices.h"

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

// `t` as a detached 0-dim float64 tensor on `device`, for the step's sums and
// its one host transfer; an undefined `t` (an absent count) is 0.
torch::Tensor Float64Scalar(const torch::Tensor& t, const torch::Device& device) {
  return t.defined() ? t.detach().to(device, torch::kFloat64).reshape({})
                     : torch::zeros({}, torch::TensorOptions(device).dtype(torch::kFloat64));
}

// The first of the step's loss terms and its gradient norm that is NaN or
// ±inf, by name; empty when all are finite.
std::string FirstNonFiniteTerm(const StepStats& s) {
  const std::pair<const char*, double> terms[] = {{"reward_loss", s.reward_loss},
                                                  {"distill_loss", s.distill_loss},
                                                  {"sft_loss", s.sft_loss},
                                                  {"grad_norm", s.grad_norm}};
  for (const auto& [name, value] : terms) {
    if (!std::isfinite(value)) return name;
  }
  return "";
}

// The numbers one step reports, by name: on the device as 0-dim float64
// tensors (undefined: 0), on the host as doubles. They cross in one
// device→host transfer (ToHost), not one per number.
template <typename T>
struct StepNumbers {
  T reward_loss{}, distill_loss{}, sft_loss{};  // the whole batch's means
  T grad_norm_sq{};  // ‖g‖² of the combined gradient, before clipping
  // Measured steps only (else 0):
  T rr{};             // ‖w_R ∇L_R‖² before any projection
  T dd{};             // ‖∇L_D‖²
  T rd{};             // ⟨w_R ∇L_R, ∇L_D⟩ before any projection
  T balanced_rr{};    // ‖g_R′‖² after m3_project
  T distill_scale{};  // s, the coefficient applied to ∇L_D

  // Every field, in the one order the transfer packs them in.
  static constexpr T StepNumbers::*kFields[] = {
      &StepNumbers::reward_loss,  &StepNumbers::distill_loss, &StepNumbers::sft_loss,
      &StepNumbers::grad_norm_sq, &StepNumbers::rr,           &StepNumbers::dd,
      &StepNumbers::rd,           &StepNumbers::balanced_rr,  &StepNumbers::distill_scale};
};

// What CombineGradients measured, into the step's numbers.
void TakeCombinedNumbers(const CombinedGradient& combined, StepNumbers<torch::Tensor>* numbers) {
  numbers->grad_norm_sq = combined.total_sq;
  numbers->rr = combined.reward_sq;
  numbers->dd = combined.distill_sq;
  numbers->rd = combined.dot;
  numbers->balanced_rr = combined.balanced_reward_sq;
  numbers->distill_scale = combined.distill_scale;
}

// The device numbers on the host: packed into one tensor, one transfer.
StepNumbers<double> ToHost(const StepNumbers<torch::Tensor>& device_numbers,
                           const torch::Device& device) {
  std::vector<torch::Tensor> packed;
  for (auto field : StepNumbers<torch::Tensor>::kFields) {
    packed.push_back(Float64Scalar(device_numbers.*field, device));
  }
  const torch::Tensor host = torch::stack(packed).to(torch::kCPU);
  const double* values = host.data_ptr<double>();
  StepNumbers<double> numbers;
  for (auto field : StepNumbers<double>::kFields) numbers.*field = *values++;
  return numbers;
}

LearningRateSchedule ConstantRate(double lr, int64_t warmup_steps) {
  LearningRateSchedule schedule;
  schedule.peak = lr;
  schedule.warmup_steps = std::max<int64_t>(0, warmup_steps);
  return schedule;
}

}  // namespace

PolicyOptimizer::PolicyOptimizer(model::Decoder model, const LearningRateSchedule& schedule,
                                 double weight_decay, double max_grad_norm)
    : model_(std::move(model)),
      params_(TrainableParameters(model_)),
      optimizer_(params_, torch::optim::AdamWOptions(schedule.At(0)).weight_decay(weight_decay)),
      schedule_(schedule),
      max_grad_norm_(max_grad_norm) {}

PolicyOptimizer::PolicyOptimizer(model::Decoder model, double lr, double weight_decay,
                                 double max_grad_norm, int64_t warmup_steps)
    : PolicyOptimizer(std::move(model), ConstantRate(lr, warmup_steps), weight_decay,
                      max_grad_norm) {}

PolicyOptimizer::FlatGradient PolicyOptimizer::MakeFlatGradient() const {
  int64_t total = 0;
  for (const torch::Tensor& p : params_) total += p.numel();
  // Sharded: padded to equal shards, which the parameters' all-gather needs.
  if (sharded_) total = sharded_->padded_length();
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
      buffer.flat.scalar_type() != first.scalar_type() ||
      (sharded_ && buffer.flat.numel() != sharded_->padded_length())) {
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

void PolicyOptimizer::set_collectives(dist::Collectives* collectives) {
  collectives_ = collectives;
  if (collectives_ == nullptr || collectives_->size() == 1) return;
  // Every rank starts from rank 0's weights; identical updates keep them so.
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : params_) params.push_back(p.data());
  collectives_->Broadcast(params, /*root=*/0);
}

void PolicyOptimizer::ShardState(ShardStage stage, int rank, int world_size) {
  if (step_ != 0 || !optimizer_.state().empty()) {
    throw std::logic_error("PolicyOptimizer::ShardState: after a step or a Load");
  }
  sharded_ = std::make_unique<ShardedAdamW>(params_, rank, world_size);
  shard_stage_ = stage;
  reward_grad_ = distill_grad_ = sft_grad_ = backward_buffer_ = FlatGradient{};  // remade padded
}

void PolicyOptimizer::CheckShardCollectives() const {
  if (collectives_ == nullptr || collectives_->size() != sharded_->world_size() ||
      collectives_->rank() != sharded_->rank()) {
    throw std::logic_error("PolicyOptimizer: sharded over " +
                           std::to_string(sharded_->world_size()) +
                           " ranks without collectives of that size and rank");
  }
}

torch::Tensor& PolicyOptimizer::UpdateGradient() {
  return gradients_sharded() ? segments_[0] : reward_grad_.flat;
}

StepStats PolicyOptimizer::Step(const LossTerms& terms, const GradientPlan& plan, bool separate) {
  BeginStep(plan, separate, terms.reward_count, terms.distill_count, terms.sft_count);
  AccumulateStep(terms);
  return FinishStep();
}

void PolicyOptimizer::BeginStep(const GradientPlan& plan, bool separate,
                                const torch::Tensor& reward_count,
                                const torch::Tensor& distill_count, const torch::Tensor& sft_count,
                                int64_t micro_batches) {
  const torch::Device device = params_.front().device();
  pending_ = PendingStep{};
  pending_.open = true;
  pending_.plan = plan;
  pending_.measured = separate || plan.balance.project || plan.balance.normalize;
  pending_.totals = torch::stack({Float64Scalar(reward_count, device),
                                  Float64Scalar(distill_count, device),
                                  Float64Scalar(sft_count, device)});
  // Data parallel (a group of any size): the means are over every rank's
  // batch, and the summed counts say which terms some rank has.
  if (collectives_ != nullptr) {
    collectives_->SumInPlace({pending_.totals});  // a no-op for one rank
    const torch::Tensor totals = pending_.totals.to(torch::kCPU);
    pending_.anywhere[0] = true;
    pending_.anywhere[1] = totals[1].item<double>() > 0;
    pending_.anywhere[2] = totals[2].item<double>() > 0 && plan.sft_weight != 0.0;
  }
  pending_.loss_sums = torch::zeros({3}, pending_.totals.options());
  if (gradients_sharded()) {
    CheckShardCollectives();
    // Every rank reduces the same signals (Reduces) the same number of
    // times: as often as the rank with the most micro-batches.
    torch::Tensor rounds = torch::full({1}, static_cast<double>(micro_batches),
                                       torch::TensorOptions(device).dtype(torch::kFloat64));
    collectives_->MaxInPlace({rounds});
    pending_.rounds_total = static_cast<int64_t>(rounds.item<double>());
    // A signal's segment accumulates its reductions, except the step's last
    // reduction's: with one round, nothing writes the backward buffer after
    // it before the update, so that segment is the buffer's own
    // (ReduceIntoSegment), and a plain one-micro-batch step holds no more
    // than the buffer.
    const int last = Reduces(2) ? 2 : (Reduces(1) ? 1 : 0);
    const int64_t length = sharded_->padded_length() / sharded_->world_size();
    for (int k = 0; k < 3; ++k) {
      const bool owned = Reduces(k) && !(pending_.rounds_total == 1 && k == last);
      segments_[k] = owned ? torch::zeros({length}, params_.front().options()) : torch::Tensor();
    }
  }
}

void PolicyOptimizer::BackwardSignal(int k, const torch::Tensor& loss, bool retain_graph) {
  const bool sharded = gradients_sharded();
  if (sharded ? !Reduces(k) : !loss.defined()) return;
  FlatGradient* buffers[3] = {&reward_grad_, &distill_grad_, &sft_grad_};
  AttachGradients(sharded ? backward_buffer_ : *buffers[k],
                  /*zero=*/sharded || !pending_.started[k]);
  pending_.started[k] = true;
  if (loss.defined()) {
    const auto start = std::chrono::steady_clock::now();
    loss.backward({}, retain_graph);
    pending_.backward_seconds[k] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (sharded) ReduceIntoSegment(k);
}

void PolicyOptimizer::ReduceIntoSegment(int k) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& flat = backward_buffer_.flat;
  collectives_->ReduceScatterInPlace(flat);
  const int64_t length = flat.numel() / sharded_->world_size();
  const torch::Tensor mine = flat.narrow(0, sharded_->rank() * length, length);
  if (segments_[k].defined()) {
    segments_[k].add_(mine);
  } else {
    segments_[k] = mine;  // the step's last reduction (BeginStep)
  }
}

void PolicyOptimizer::PadReductions() {
  torch::NoGradGuard no_grad;
  for (; pending_.rounds_done < pending_.rounds_total; ++pending_.rounds_done) {
    for (int k = 0; k < 3; ++k) {
      if (!Reduces(k)) continue;
      AttachGradients(backward_buffer_, /*zero=*/true);
      ReduceIntoSegment(k);
    }
  }
}

void PolicyOptimizer::AccumulateStep(const LossTerms& terms) {
  if (!pending_.open) throw std::logic_error("PolicyOptimizer::AccumulateStep before BeginStep");
  const GradientPlan& plan = pending_.plan;
  auto has_graph = [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); };
  const bool has_distill = has_graph(terms.distill_loss);
  const bool has_sft = has_graph(terms.sft_loss) && plan.sft_weight != 0.0;
  const torch::Device device = params_.front().device();
  const torch::Tensor counts = torch::stack({Float64Scalar(terms.reward_count, device),
                                             Float64Scalar(terms.distill_count, device),
                                             Float64Scalar(terms.sft_count, device)});
  // A term's mean L = s / max(c, 1) over its c tokens (or sequences). The
  // whole step's mean, over every micro-batch and every rank, is
  // Σ s / max(C, 1) with C = Σ c. Scaling each piece's L by c / max(C, 1)
  // before its backward makes the summed gradient the gradient of that mean,
  // whatever the split, instead of a mean of means. (c = 0 means L = 0:
  // nothing to weigh.)
  const torch::Tensor shares = counts / pending_.totals.clamp_min(1.0);
  auto scaled = [&](const torch::Tensor& loss, int64_t i) {
    return loss * shares[i].to(loss.scalar_type());
  };
  {
    torch::NoGradGuard no_grad;
    // Absent terms are graph-less zeros (LossTerms).
    pending_.loss_sums += torch::stack({Float64Scalar(terms.reward_loss, device),
                                        Float64Scalar(terms.distill_loss, device),
                                        Float64Scalar(terms.sft_loss, device)}) *
                          counts;
  }
  if (terms.combined_loss.defined() && pending_.measured) {
    throw std::logic_error(
        "PolicyOptimizer::AccumulateStep: a precombined loss in a step that measures the "
        "signals apart");
  }
  pending_.any_distill |= has_distill || (terms.combined_loss.defined() && terms.combined_distill);
  pending_.any_sft |= has_sft;

  if (pending_.measured) {
    // One backward per signal, each into its own buffer (or segment); the
    // shared graph (the logits) is kept until the last one.
    BackwardSignal(0, scaled(terms.reward_loss, 0), /*retain_graph=*/has_distill || has_sft);
    BackwardSignal(1, has_distill ? scaled(terms.distill_loss, 1) : torch::Tensor(),
                   /*retain_graph=*/has_sft);
    BackwardSignal(2, has_sft ? scaled(terms.sft_loss, 2) : torch::Tensor(),
                   /*retain_graph=*/false);
  } else {
    // PlainWeights already scaled a precombined loss's two terms.
    torch::Tensor total = terms.combined_loss;
    if (!total.defined()) {
      total = plan.reward_weight * scaled(terms.reward_loss, 0);
      if (has_distill) total = total + plan.distill_weight * scaled(terms.distill_loss, 1);
    }
    if (has_sft) total = total + plan.sft_weight * scaled(terms.sft_loss, 2);
    BackwardSignal(0, total, /*retain_graph=*/false);
  }
  ++pending_.rounds_done;
}

std::pair<double, double> PolicyOptimizer::PlainWeights(const torch::Tensor& reward_count,
                                                        const torch::Tensor& distill_count) const {
  if (!pending_.open || pending_.measured) {
    throw std::logic_error("PolicyOptimizer::PlainWeights needs an open step that is not measured");
  }
  const torch::Tensor totals = pending_.totals.to(torch::kCPU).clamp_min(1.0);
  const double reward_share =
      reward_count.to(torch::kCPU, torch::kFloat64).item<double>() / totals[0].item<double>();
  const double distill_share =
      distill_count.to(torch::kCPU, torch::kFloat64).item<double>() / totals[1].item<double>();
  return {pending_.plan.reward_weight * reward_share, pending_.plan.distill_weight * distill_share};
}

StepStats PolicyOptimizer::FinishStep() {
  if (!pending_.open) throw std::logic_error("PolicyOptimizer::FinishStep before BeginStep");
  const auto start = std::chrono::steady_clock::now();
  StepStats stats = CombineAndApply();
  std::copy(std::begin(pending_.backward_seconds), std::end(pending_.backward_seconds),
            std::begin(stats.backward_seconds));
  stats.update_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

StepStats PolicyOptimizer::CombineAndApply() {
  pending_.open = false;
  const GradientPlan& plan = pending_.plan;
  const torch::Device device = params_.front().device();
  torch::NoGradGuard no_grad;
  if (gradients_sharded()) {
    PadReductions();
  } else if (!pending_.started[0]) {
    AttachGradients(reward_grad_, /*zero=*/true);
  }
  // Data parallel: a rank without some term still sums a zero gradient for
  // it, so the collectives match up; whether any rank has one is in the
  // summed counts. The reported losses are then the whole batch's.
  const bool parallel = collectives_ != nullptr && collectives_->size() > 1;
  bool any_distill = pending_.any_distill, any_sft = pending_.any_sft;
  torch::Tensor loss_sums = pending_.loss_sums;
  if (parallel) {
    collectives_->SumInPlace({loss_sums});
    any_distill = pending_.anywhere[1];
    any_sft = pending_.anywhere[2];
  }
  const torch::Tensor losses = loss_sums / pending_.totals.clamp_min(1.0);
  StepNumbers<torch::Tensor> on_device;
  on_device.reward_loss = losses[0];
  on_device.distill_loss = losses[1];
  on_device.sft_loss = losses[2];

  StepStats stats;
  stats.measured = pending_.measured;
  // Sharded gradients: each rank holds its segment of the summed
  // gradients, and every norm and dot product is a partial sum, summed.
  const PartialSumReducer sum_over_shards = gradients_sharded()
                                                ? PartialSumReducer([this](torch::Tensor& partial) {
                                                    collectives_->SumInPlace({partial.view({-1})});
                                                  })
                                                : PartialSumReducer();
  if (stats.measured && gradients_sharded()) {
    GradientList distill(1), sft(1);
    if (Reduces(1)) distill[0] = segments_[1];
    if (Reduces(2)) sft[0] = segments_[2];
    // Combines in place into the reward segment.
    const CombinedGradient combined = CombineGradients(
        {segments_[0]}, std::move(distill), std::move(sft), plan, device, sum_over_shards);
    TakeCombinedNumbers(combined, &on_device);
  } else if (stats.measured) {
    GradientList distill(1), sft(1);
    if (any_distill) {
      AttachGradients(distill_grad_, /*zero=*/!pending_.started[1]);
      distill[0] = distill_grad_.flat;
    }
    if (any_sft) {
      AttachGradients(sft_grad_, /*zero=*/!pending_.started[2]);
      sft[0] = sft_grad_.flat;
    }
    if (parallel) {
      std::vector<torch::Tensor> buffers = {reward_grad_.flat};
      if (any_distill) buffers.push_back(distill_grad_.flat);
      if (any_sft) buffers.push_back(sft_grad_.flat);
      collectives_->SumInPlace(buffers);
    }
    // Combines in place into the reward buffer, which becomes .grad.
    const CombinedGradient combined =
        CombineGradients({reward_grad_.flat}, std::move(distill), std::move(sft), plan, device);
    AttachGradients(reward_grad_, /*zero=*/false);
    TakeCombinedNumbers(combined, &on_device);
  } else if (gradients_sharded()) {
    on_device.grad_norm_sq = DotInFloat64(segments_[0], segments_[0]);
    sum_over_shards(on_device.grad_norm_sq);
  } else {
    if (parallel) collectives_->SumInPlace({reward_grad_.flat});
    on_device.grad_norm_sq = DotInFloat64(reward_grad_.flat, reward_grad_.flat);
  }

  // One device→host transfer for every number of the step.
  const StepNumbers<double> n = ToHost(on_device, device);
  stats.reward_loss = n.reward_loss;
  stats.distill_loss = any_distill ? n.distill_loss : 0.0;
  stats.sft_loss = n.sft_loss;
  stats.grad_norm = std::sqrt(n.grad_norm_sq);
  if (stats.measured) {
    stats.reward_grad_norm = std::sqrt(n.rr);
    stats.distill_grad_norm = std::sqrt(n.dd);
    stats.grad_cosine = (n.rr > 0 && n.dd > 0) ? n.rd / std::sqrt(n.rr * n.dd) : 0.0;
    stats.balanced_reward_grad_norm = std::sqrt(n.balanced_rr);
    stats.distill_scale = n.distill_scale;
    stats.projected = plan.balance.project && n.rd < 0 && n.dd > 0;
  } else {
    stats.distill_scale = plan.distill_weight;
  }
  // Neither clipping nor AdamW repairs a NaN: skip, leave everything as it was.
  stats.nonfinite_term = FirstNonFiniteTerm(stats);
  if (!stats.skipped()) ClipAndApply(stats.grad_norm, &stats);
  for (torch::Tensor& segment : segments_) segment = torch::Tensor();  // held for a step only
  return stats;
}

void PolicyOptimizer::ClipAndApply(double grad_norm, StepStats* stats) {
  torch::Tensor& gradient = UpdateGradient();
  if (max_grad_norm_ > 0 && grad_norm > max_grad_norm_) {
    gradient.mul_(max_grad_norm_ / (grad_norm + 1e-6));
  }
  stats->lr = schedule_.At(step_);
  for (auto& group : optimizer_.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(stats->lr);
  }
  if (sharded_) {
    CheckShardCollectives();
    const auto& options =
        static_cast<const torch::optim::AdamWOptions&>(optimizer_.param_groups().front().options());
    // The update's gradient: the whole summed vector, or this rank's
    // segment of it, which begins at rank · segment length.
    const int64_t gradient_begin = gradients_sharded() ? sharded_->rank() * gradient.numel() : 0;
    sharded_->Step(gradient, gradient_begin, options, stats->lr);
    // The gradients are spent: a full-size buffer carries the parameters'
    // all-gather.
    sharded_->GatherParameters(*collectives_,
                               gradients_sharded() ? backward_buffer_.flat : reward_grad_.flat);
  } else {
    AdamWStepInSlices(optimizer_);  // optimizer_.step(), without its full-size temporaries
  }
  ++step_;
}

void PolicyOptimizer::Save(const std::string& path) const {
  torch::serialize::OutputArchive archive;
  if (sharded_) {
    sharded_->Write(archive);
  } else {
    optimizer_.save(archive);
  }
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
    if (sharded_) {
      LoadShard(archive);
    } else if (ShardedAdamW::Holds(archive)) {
      throw std::runtime_error(
          "it holds one rank's shard (learner.shard: optimizer) and this "
          "learner is unsharded: resume with the run's learner.shard and "
          "learner.world_size");
    } else {
      optimizer_.load(archive);
    }
    torch::Tensor step;
    archive.read("kappa_policy_optimizer_step", step);
    step_ = step.item<int64_t>();
  } catch (const c10::Error& e) {
    throw std::runtime_error("PolicyOptimizer::Load: cannot read optimizer state from " + path +
                             ": " + e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("PolicyOptimizer::Load: cannot resume from " + path + ": " + e.what());
  }
}

void PolicyOptimizer::LoadResharded(const std::vector<std::string>& paths) {
  if (paths.empty()) throw std::runtime_error("PolicyOptimizer::LoadResharded: no files");
  std::vector<ShardedAdamW::Saved> set;
  int64_t step = 0;
  for (const std::string& path : paths) {
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(path, params_.front().device());
      if (!ShardedAdamW::Holds(archive)) {
        if (!set.empty()) throw std::runtime_error("it is unsharded, the others are shards");
        Load(path);  // an unsharded run's whole state, as its rank 0 held it
        return;
      }
      set.push_back(ShardedAdamW::ReadSaved(archive));
      torch::Tensor counter;
      archive.read("kappa_policy_optimizer_step", counter);
      step = counter.item<int64_t>();
    } catch (const c10::Error& e) {
      throw std::runtime_error("PolicyOptimizer::LoadResharded: cannot read optimizer state from " +
                               path + ": " + e.what_without_backtrace());
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("PolicyOptimizer::LoadResharded: " + path + ": " + e.what());
    }
  }
  try {
    if (sharded_) {
      sharded_->ReadResharded(set);
    } else {
      int64_t total = 0;
      for (const torch::Tensor& p : params_) total += p.numel();
      torch::Tensor exp_avg, exp_avg_sq;
      int64_t adam_step = 0;
      ShardedAdamW::Assemble(set, total, &exp_avg, &exp_avg_sq, &adam_step);
      SetUnshardedMoments(exp_avg, exp_avg_sq, adam_step);
    }
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("PolicyOptimizer::LoadResharded: cannot reshard " +
                             std::to_string(paths.size()) + " files (first " + paths.front() +
                             "): " + e.what());
  }
  step_ = step;
}

void PolicyOptimizer::SetUnshardedMoments(const torch::Tensor& exp_avg,
                                          const torch::Tensor& exp_avg_sq, int64_t adam_step) {
  optimizer_.state().clear();
  if (adam_step == 0) return;  // saved before the first update: no state yet
  int64_t offset = 0;
  for (const torch::Tensor& p : params_) {
    torch::optim::AdamWParamState& state = AdamWStateFor(optimizer_, p);
    state.exp_avg(exp_avg.narrow(0, offset, p.numel()).view(p.sizes()).clone());
    state.exp_avg_sq(exp_avg_sq.narrow(0, offset, p.numel()).view(p.sizes()).clone());
    state.step(adam_step);
    offset += p.numel();
  }
}

void PolicyOptimizer::LoadShard(torch::serialize::InputArchive& archive) {
  if (ShardedAdamW::Holds(archive)) {
    sharded_->Read(archive);
    return;
  }
  // An unsharded run's state: this rank's share of it, then let it go.
  optimizer_.load(archive);
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;
  int64_t step = 0;
  for (const torch::Tensor& p : params_) {
    const torch::optim::AdamWParamState* state = FindAdamWState(optimizer_, p);
    if (state == nullptr) {  // saved before the first update: zero moments
      exp_avg.push_back(torch::zeros_like(p));
      exp_avg_sq.push_back(torch::zeros_like(p));
      continue;
    }
    exp_avg.push_back(state->exp_avg());
    exp_avg_sq.push_back(state->exp_avg_sq());
    step = state->step();
  }
  sharded_->ReadUnsharded(exp_avg, exp_avg_sq, step);
  optimizer_.state().clear();
}

}  // namespace kappa::learner
