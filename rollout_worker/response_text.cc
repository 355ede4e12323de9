#include "rollout_worker/response_text.h"

#include <exception>

#include "model/tokenizer.h"

namespace kappa::rollout {

std::string ResponseText(const std::vector<int64_t>& ids) {
  static const model::CharTokenizer tokenizer;
  try {
    return tokenizer.Decode(ids);
  } catch (const std::exception&) {
    std::vector<int64_t> known;
    for (int64_t id : ids) {
      if (id >= 0 && id < tokenizer.vocab_size()) known.push_back(id);
    }
    try {
      return tokenizer.Decode(known);
    } catch (const std::exception&) {
      return "";
    }
  }
}

}  // namespace kappa::rollout
