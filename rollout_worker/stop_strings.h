// rollout.stop_strings: generation also ends at the first occurrence of any
// stop string in the decoded response (vLLM's `stop`), and such a response
// counts as stopped, not truncated.
//
// Applied after sampling, post hoc: model::Sample knows no text, so rows run
// on to a stop id or their budget, and the response is then cut to its
// shortest prefix whose decode contains a stop string — right after the
// token that completes it, which stays (as vLLM keeps the token ids; the
// text kept is that prefix's decode, stop string included). Every kept
// token was drawn before the ones dropped, so the result is distributed
// exactly as if sampling had stopped there; the dropped tokens only cost
// decode steps.
//
// The text comes from a TokenDecoder, so the tokenizer stays outside: the
// worker passes its own (GroupSamplerOptions::decode), tests the character
// tokenizer's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/sampling.h"

namespace kappa::rollout {

// Response token ids -> text. Must not throw for ids the model can sample.
using TokenDecoder = std::function<std::string(const std::vector<int64_t>&)>;

// The length of the shortest prefix of `tokens` whose decode contains one of
// `stop_strings` (empty strings are ignored), or nullopt when even the whole
// response's does not. One decode when there is no stop string in it, about
// log2(T) + 1 when there is: the prefixes are bisected, which assumes that
// once a prefix's decode contains a stop string every longer prefix's does
// (true of a decoder whose decode of a prefix is a prefix of the text).
std::optional<size_t> StopStringPrefix(const std::vector<int64_t>& tokens,
                                       const std::vector<std::string>& stop_strings,
                                       const TokenDecoder& decode);

// Cuts `sequence` (tokens and log-probs) to StopStringPrefix and marks it not
// truncated; returns whether its decode contained a stop string. Leaves it
// untouched otherwise.
bool CutAtStopString(model::SampledSequence& sequence, const std::vector<std::string>& stop_strings,
                     const TokenDecoder& decode);

}  // namespace kappa::rollout
