#include "learner/algo/evaluate.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

#include "model/generation_config.h"
#include "model/sampling.h"

namespace kappa::learner {

double GreedyAccuracy(
    model::Decoder& model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
    const std::function<bool(size_t index, const std::vector<int64_t>& response_tokens)>&
        is_correct,
    int64_t batch_size, int64_t vocab_limit) {
  if (prompts.empty()) throw std::invalid_argument("GreedyAccuracy: no prompts");
  if (batch_size <= 0) throw std::invalid_argument("GreedyAccuracy: batch_size must be > 0");
  model::SamplingParams params;
  params.max_new_tokens = max_new_tokens;
  params.temperature = 0.0;
  params.stop_token_ids = model::StopTokenIds(model->config());
  params.pad_id = model->config().pad_token_id;
  params.sampleable_vocab_size = vocab_limit;

  const bool was_training = model->is_training();
  model->eval();
  size_t correct = 0;
  const size_t chunk = static_cast<size_t>(batch_size);
  std::vector<std::vector<int64_t>> batch;
  for (size_t start = 0; start < prompts.size(); start += chunk) {
    const size_t end = std::min(prompts.size(), start + chunk);
    batch.assign(prompts.begin() + start, prompts.begin() + end);
    const std::vector<model::SampledSequence> out = model::Sample(model, batch, params);
    for (size_t k = 0; k < out.size(); ++k) {
      if (is_correct(start + k, out[k].tokens)) ++correct;
    }
  }
  model->train(was_training);
  return static_cast<double>(correct) / static_cast<double>(prompts.size());
}

}  // namespace kappa::learner
