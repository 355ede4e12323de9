// rollout.stop_strings: generation also ends at the first occurrence of any
// stop string in the decoded response (vLLM's `stop`), and such a response
// counts as stopped, not truncated.
//
// Two parts. While decoding, the engine ends a row the step a stop string
// appears (StopStringCheck as DecodeRequest::stops_after), so the row's slot
// goes to a waiting row instead of running on to a stop id or the budget;
// model::Sample knows no text, so its rows do run on. After sampling, every
// response is cut to its shortest prefix whose decode contains a stop
// string (CutAtStopString) — right after the token that completes it, which
// stays (as vLLM keeps the token ids; the text kept is that prefix's
// decode, stop string included). The cut is what defines the response:
// every kept token was drawn before the ones dropped, and each row draws
// from its own stream, so the result is the same whether the engine stopped
// the row early, late or not at all; stopping early only saves decode steps.
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

// A check for DecodeRequest::stops_after: true when one of `stop_strings`
// appears in the text of the response's last tokens and in its whole
// decode; asked after every token, it fires on the token that completes
// the stop string. A call decodes only the response's last (longest stop
// string's bytes + 2) tokens and, when that tail's text holds a stop
// string, confirms on the whole response's decode, so it costs about the
// longest stop string per token, not the response's length. It can miss a
// stop string spread over more tokens than that (ones that decode to no
// text); the row then runs on and CutAtStopString still cuts it. It never
// stops a row whose whole decode holds no stop string. Empty when no stop
// string is non-empty (nothing to check).
using StopCheck = std::function<bool(const std::vector<int64_t>& response)>;
StopCheck StopStringCheck(std::vector<std::string> stop_strings, TokenDecoder decode);

}  // namespace kappa::rollout
