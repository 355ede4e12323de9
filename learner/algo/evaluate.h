// Greedy-decoding accuracy of a policy on a fixed prompt set (the demo's
// held-out evaluation and `kappa eval`).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.h"

namespace kappa::learner {

// Decodes every prompt greedily (temperature 0) in batches of `batch_size`,
// each response ending at the model's stop ids (model::StopTokenIds, read
// once per call) or max_new_tokens, over the first `vocab_limit` ids (0: all
// rows; see model::VocabLimit), and returns the fraction for which
// is_correct(index into prompts, response tokens) holds. Throws
// std::invalid_argument on an empty prompt set or batch_size <= 0.
double GreedyAccuracy(
    model::Decoder& model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
    const std::function<bool(size_t index, const std::vector<int64_t>& response_tokens)>&
        is_correct,
    int64_t batch_size = 256, int64_t vocab_limit = 0);

}  // namespace kappa::learner
