#include "learner/dataset_accuracy.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "learner/algo/evaluate.h"
#include "tasks/answer.h"

namespace kappa::learner {

std::vector<bool> DatasetCorrectness(model::Decoder& policy, const PromptEncoder& prompts,
                                     const tasks::Dataset& dataset, size_t count,
                                     int64_t max_new_tokens, int64_t vocab_limit) {
  count = std::min(count, dataset.size());
  // No example (trainer.eval_examples: 0, an empty held-out set): no
  // verdict, where GreedyAccuracy would refuse an empty prompt set.
  if (count == 0) return {};
  std::vector<std::vector<int64_t>> prompt_ids;
  prompt_ids.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    absl::StatusOr<std::vector<int64_t>> ids = prompts.Encode(dataset.at(i));
    if (!ids.ok()) throw std::invalid_argument(std::string(ids.status().message()));
    prompt_ids.push_back(*std::move(ids));
  }
  std::vector<bool> correct(count, false);
  GreedyAccuracy(
      policy, prompt_ids, max_new_tokens,
      [&](size_t index, const std::vector<int64_t>& response) {
        const tasks::Example& example = dataset.at(index);
        absl::StatusOr<float> reward = tasks::ExactAnswerReward(example.task, example.answer,
                                                                prompts.DecodeResponse(response));
        correct[index] = reward.ok() && *reward > 0.5f;
        return correct[index];
      },
      /*batch_size=*/256, vocab_limit);
  return correct;
}

double DatasetAccuracy(model::Decoder& policy, const PromptEncoder& prompts,
                       const tasks::Dataset& dataset, size_t count, int64_t max_new_tokens,
                       int64_t vocab_limit) {
  const std::vector<bool> correct =
      DatasetCorrectness(policy, prompts, dataset, count, max_new_tokens, vocab_limit);
  if (correct.empty()) return 0.0;
  return static_cast<double>(std::count(correct.begin(), correct.end(), true)) /
         static_cast<double>(correct.size());
}

}  // namespace kappa::learner
