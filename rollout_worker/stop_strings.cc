#include "rollout_worker/stop_strings.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

namespace kappa::rollout {
namespace {

bool ContainsAny(const std::string& text, const std::vector<std::string>& stop_strings) {
  for (const std::string& stop : stop_strings) {
    if (!stop.empty() && text.find(stop) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::optional<size_t> StopStringPrefix(const std::vector<int64_t>& tokens,
                                       const std::vector<std::string>& stop_strings,
                                       const TokenDecoder& decode) {
  if (tokens.empty() || !ContainsAny(decode(tokens), stop_strings)) return std::nullopt;
  // Invariant: the prefix of length `high` contains a stop string, the one of
  // length `low` does not (the empty prefix decodes to no text).
  size_t low = 0, high = tokens.size();
  while (high - low > 1) {
    const size_t mid = low + (high - low) / 2;
    const std::vector<int64_t> prefix(tokens.begin(), tokens.begin() + static_cast<long>(mid));
    if (ContainsAny(decode(prefix), stop_strings)) {
      high = mid;
    } else {
      low = mid;
    }
  }
  return high;
}

bool CutAtStopString(model::SampledSequence& sequence, const std::vector<std::string>& stop_strings,
                     const TokenDecoder& decode) {
  const std::optional<size_t> keep = StopStringPrefix(sequence.tokens, stop_strings, decode);
  if (!keep) return false;
  sequence.tokens.resize(*keep);
  if (sequence.logprobs.size() > *keep) sequence.logprobs.resize(*keep);
  sequence.truncated = false;
  return true;
}

StopCheck StopStringCheck(std::vector<std::string> stop_strings, TokenDecoder decode) {
  size_t longest = 0;
  for (const std::string& stop : stop_strings) longest = std::max(longest, stop.size());
  if (longest == 0) return nullptr;
  // Every token that decodes to at least one byte: the tail covers a stop
  // string completed by the newest token, with one token of context before.
  const size_t window = longest + 2;
  return [stop_strings = std::move(stop_strings), decode = std::move(decode),
          window](const std::vector<int64_t>& response) {
    const size_t start = response.size() > window ? response.size() - window : 0;
    const std::vector<int64_t> tail(response.begin() + static_cast<long>(start), response.end());
    if (!ContainsAny(decode(tail), stop_strings)) return false;
    return start == 0 || ContainsAny(decode(response), stop_strings);
  };
}

}  // namespace kappa::rollout
