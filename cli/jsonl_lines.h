// The line loop of the JSON-lines files the reports read (metrics.jsonl,
// conflict_atlas.jsonl): blank lines skipped, each other line parsed and
// checked, its number and whether it ended with a newline kept, so a reader
// can tell a damaged line (reported as file:line) from a last line still
// being written (no newline yet).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace kappa::cli {

struct JsonLine {
  int64_t number = 0;       // 1-based, blank lines counted
  bool terminated = false;  // ended with '\n'
  nlohmann::json record;    // the parsed line (when it parsed)
  std::string why;          // empty: accepted; else why it was refused
};

// Calls visit(line) for every non-blank line of `text`, in order. `reject`
// sees each line that parsed and returns why it is refused ("" accepts it);
// a line that is not JSON is refused as "not valid JSON (<parser message>)".
void ForEachJsonLine(const std::string& text,
                     const std::function<std::string(const nlohmann::json&)>& reject,
                     const std::function<void(JsonLine&)>& visit);

}  // namespace kappa::cli
