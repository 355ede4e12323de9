// Greedy accuracy of a policy on a dataset, scored by the same exact-answer
// reward the verifier uses — the one held-out evaluation shared by the
// learner's periodic eval and `kappa sft`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "learner/prompt_encoder.h"
#include "model/transformer.h"
#include "tasks/dataset.h"

namespace kappa::learner {

// Over the first `count` examples (clamped to the dataset size), prompts as
// `prompts` encodes them, decoding as GreedyAccuracy does (the policy's stop
// ids; ids below `vocab_limit`, 0: every row). Throws std::invalid_argument
// for an example `prompts` cannot encode (the learner checks them all at
// start-up, PromptEncoder::EncodeAll).
// One verdict per example (the same decoding and reward as DatasetAccuracy),
// in dataset order, over the first `count` examples (clamped).
std::vector<bool> DatasetCorrectness(model::Decoder& policy, const PromptEncoder& prompts,
                                     const tasks::Dataset& dataset, size_t count,
                                     int64_t max_new_tokens, int64_t vocab_limit = 0);

// The share of DatasetCorrectness that is true; 0 for no example.
double DatasetAccuracy(model::Decoder& policy, const PromptEncoder& prompts,
                       const tasks::Dataset& dataset, size_t count, int64_t max_new_tokens,
                       int64_t vocab_limit = 0);

}  // namespace kappa::learner
