#include "learner/algo/sft.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

namespace kappa::learner {
namespace {

struct SftBatch {
  torch::Tensor input, attention, target, mask;
};

SftBatch Collate(const std::vector<SftExample>& examples, const std::vector<size_t>& picks,
                 int64_t pad_id) {
  int64_t max_len = 0;
  for (size_t k : picks) {
    const SftExample& e = examples[k];
    max_len = std::max<int64_t>(max_len, e.prompt_tokens.size() + e.answer_tokens.size() - 1);
  }
  const int64_t batch = static_cast<int64_t>(picks.size());
  SftBatch out;
  out.input = torch::full({batch, max_len}, pad_id, torch::kInt64);
  out.target = torch::full({batch, max_len}, pad_id, torch::kInt64);
  out.attention = torch::zeros({batch, max_len}, torch::kBool);
  out.mask = torch::zeros({batch, max_len}, torch::kFloat32);
  auto input = out.input.accessor<int64_t, 2>();
  auto target = out.target.accessor<int64_t, 2>();
  auto attention = out.attention.accessor<bool, 2>();
  auto mask = out.mask.accessor<float, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    const SftExample& e = examples[picks[b]];
    const int64_t prompt_len = static_cast<int64_t>(e.prompt_tokens.size());
    const int64_t seq_len = prompt_len + static_cast<int64_t>(e.answer_tokens.size());
    auto token_at = [&](int64_t k) {
      return k < prompt_len ? e.prompt_tokens[k] : e.answer_tokens[k - prompt_len];
    };
    for (int64_t t = 0; t + 1 < seq_len; ++t) {
      input[b][t] = token_at(t);
      target[b][t] = token_at(t + 1);
      attention[b][t] = true;
      // Position t predicts sequence[t + 1]: an answer token from t = P - 1 on.
      mask[b][t] = t + 1 >= prompt_len ? 1.0f : 0.0f;
    }
  }
  return out;
}

void Validate(const model::Decoder& model, const std::vector<SftExample>& examples,
              const SftOptions& options) {
  if (examples.empty()) throw std::invalid_argument("SftTrain: no examples");
  if (options.batch_size <= 0) throw std::invalid_argument("SftTrain: batch_size must be > 0");
  if (options.steps < 0) throw std::invalid_argument("SftTrain: steps must be >= 0");
  const int64_t max_positions = model->config().max_position_embeddings;
  for (size_t i = 0; i < examples.size(); ++i) {
    const SftExample& e = examples[i];
    if (e.prompt_tokens.empty() || e.answer_tokens.empty()) {
      throw std::invalid_argument("SftTrain: example " + std::to_string(i) +
                                  " has an empty prompt or answer");
    }
    const int64_t len = static_cast<int64_t>(e.prompt_tokens.size() + e.answer_tokens.size()) - 1;
    if (len > max_positions) {
      throw std::invalid_argument("SftTrain: example " + std::to_string(i) + " needs " +
                                  std::to_string(len) + " positions, the model has " +
                                  std::to_string(max_positions));
    }
    if (!(e.weight > 0.0) || !std::isfinite(e.weight)) {
      throw std::invalid_argument("SftTrain: example " + std::to_string(i) + " has weight " +
                                  std::to_string(e.weight) + ", not > 0");
    }
  }
}

// Draws example indices with replacement, each with chance proportional to
// its weight. With every weight 1 it draws uniformly, as SftTrain always did,
// so the bootstraps of unweighted example sets keep their draw order.
class ExamplePicker {
 public:
  ExamplePicker(const std::vector<SftExample>& examples, uint64_t seed) : rng_(seed) {
    std::vector<double> weights;
    weights.reserve(examples.size());
    for (const SftExample& e : examples) weights.push_back(e.weight);
    weighted_ = std::any_of(weights.begin(), weights.end(), [](double w) { return w != 1.0; });
    uniform_ = std::uniform_int_distribution<size_t>(0, examples.size() - 1);
    by_weight_ = std::discrete_distribution<size_t>(weights.begin(), weights.end());
  }

  size_t Next() { return weighted_ ? by_weight_(rng_) : uniform_(rng_); }

 private:
  std::mt19937_64 rng_;
  bool weighted_ = false;
  std::uniform_int_distribution<size_t> uniform_;
  std::discrete_distribution<size_t> by_weight_;
};

}  // namespace

torch::Tensor SftNll(const torch::Tensor& logits, const torch::Tensor& targets,
                     const torch::Tensor& mask, torch::Tensor* count) {
  if (logits.dim() != 3 || targets.sizes() != logits.sizes().slice(0, 2) ||
      mask.sizes() != targets.sizes()) {
    throw std::invalid_argument("SftNll: want logits [B, T, V], targets and mask [B, T]; got " +
                                c10::str(logits.sizes()) + ", " + c10::str(targets.sizes()) +
                                ", " + c10::str(mask.sizes()));
  }
  const int64_t vocab = logits.size(2);
  // cross_entropy fuses log_softmax and the gather: no [B, T, V] log-probs kept.
  const torch::Tensor nll = torch::nn::functional::cross_entropy(
      logits.reshape({-1, vocab}).to(torch::kFloat32), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  const torch::Tensor weight = mask.reshape({-1}).to(nll.scalar_type());
  const torch::Tensor tokens = weight.sum();
  if (count != nullptr) *count = tokens.detach();
  return (nll * weight).sum() / tokens.clamp_min(1);
}

double WarmupCosineLr(double lr, int64_t step, int64_t warmup_steps, int64_t total_steps) {
  if (warmup_steps > 0 && step < warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  return lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

double SftTrain(model::Decoder& model, const std::vector<SftExample>& examples,
                const SftOptions& options) {
  Validate(model, examples, options);
  const auto params = model->parameters();
  const torch::Device device = params.front().device();
  torch::optim::AdamW optimizer(
      params, torch::optim::AdamWOptions(options.lr).weight_decay(options.weight_decay));
  ExamplePicker picker(examples, options.seed);
  const int64_t pad_id = model->config().pad_token_id;
  model->train();

  double loss_value = 0.0;
  std::vector<size_t> picks(options.batch_size);
  for (int64_t step = 0; step < options.steps; ++step) {
    for (size_t& k : picks) k = picker.Next();
    const SftBatch batch = Collate(examples, picks, pad_id);
    const torch::Tensor logits =
        model->Forward(batch.input.to(device), batch.attention.to(device)).logits;
    const torch::Tensor loss = SftNll(logits, batch.target.to(device), batch.mask.to(device));

    optimizer.zero_grad();
    loss.backward();
    if (options.max_grad_norm > 0) {
      torch::nn::utils::clip_grad_norm_(params, options.max_grad_norm);
    }
    const double lr = WarmupCosineLr(options.lr, step, options.warmup_steps, options.steps);
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    optimizer.step();
    loss_value = loss.item<double>();
    if (options.on_step) options.on_step(step, loss_value);
    if (options.stop_after && options.stop_after(step + 1)) break;
  }
  return loss_value;
}

}  // namespace kappa::learner
