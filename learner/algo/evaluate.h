// Greedy-decoding accuracy of a policy on a fixed prompt set (the demo's
// held-out evaluation and `kappa eval`).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.h"

namespace kappa::learner {

// Decodes every prompt greedily (temperature 0) in batches of `batch_size`
// and returns the fraction for which is_correct(index into prompts,
// response tokens) holds. Throws std::invalid_argument on an empty prompt
// set or batch_size <= 0.
double GreedyAccuracy(
    model::Decoder& model, const std::vector<std::vector<int64_t>>& prompts,
    int64_t max_new_tokens,
    const std::function<bool(size_t index, const std::vector<int64_t>& response_tokens)>&
        is_correct,
    int64_t batch_size = 256);

}  // namespace kappa::learner
