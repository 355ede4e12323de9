#include "rollout_worker/response_text.h"

#include "model/tokenizer.h"

namespace kappa::rollout {

std::string ResponseText(const std::vector<int64_t>& ids) {
  static const model::CharTokenizer tokenizer;
  // Decode refuses ids outside the alphabet; dropping them first is what
  // makes this total.
  std::vector<int64_t> known;
  known.reserve(ids.size());
  for (int64_t id : ids) {
    if (id >= 0 && id < tokenizer.vocab_size()) known.push_back(id);
  }
  return tokenizer.Decode(known);
}

}  // namespace kappa::rollout
