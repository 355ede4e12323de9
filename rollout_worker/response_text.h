// The text of a response as the verifier and the logs see it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kappa::rollout {

// Decodes with the character tokenizer (stops at EOS, skips PAD/BOS). Never
// fails, so a model whose vocabulary is larger than the alphabet cannot lose
// a group over it: unknown ids are dropped from the text only.
std::string ResponseText(const std::vector<int64_t>& ids);

}  // namespace kappa::rollout
