#include "cli/jsonl_lines.h"

#include "absl/strings/str_cat.h"

namespace kappa::cli {

void ForEachJsonLine(const std::string& text,
                     const std::function<std::string(const nlohmann::json&)>& reject,
                     const std::function<void(JsonLine&)>& visit) {
  size_t begin = 0;
  int64_t number = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    ++number;
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    JsonLine parsed;
    parsed.number = number;
    parsed.terminated = terminated;
    try {
      parsed.record = nlohmann::json::parse(line);
      parsed.why = reject(parsed.record);
    } catch (const nlohmann::json::parse_error& e) {
      // The parser's message says where in the line it stopped.
      parsed.why = absl::StrCat("not valid JSON (", e.what(), ")");
    }
    visit(parsed);
  }
}

}  // namespace kappa::cli
