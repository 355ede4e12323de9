#include "learner/dataset_accuracy.h"

#include <algorithm>
#include <vector>

#include "learner/algo/evaluate.h"
#include "tasks/answer.h"

namespace kappa::learner {

double DatasetAccuracy(model::Decoder& policy, const model::CharTokenizer& tokenizer,
                       const tasks::Dataset& dataset, size_t count, int64_t max_new_tokens,
                       int64_t vocab_limit) {
  count = std::min(count, dataset.size());
  std::vector<std::vector<int64_t>> prompts;
  prompts.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    prompts.push_back(tokenizer.Encode(dataset.at(i).prompt, /*add_bos=*/true));
  }
  return GreedyAccuracy(
      policy, prompts, max_new_tokens, [&](size_t index, const std::vector<int64_t>& response) {
        const tasks::Example& example = dataset.at(index);
        absl::StatusOr<float> reward =
            tasks::ExactAnswerReward(example.task, example.answer, tokenizer.Decode(response));
        return reward.ok() && *reward > 0.5f;
      },
      /*batch_size=*/256, vocab_limit);
}

}  // namespace kappa::learner
