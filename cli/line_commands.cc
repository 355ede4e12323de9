#include "cli/line_commands.h"

#include <iostream>

#include "base/status.h"

namespace kappa::cli {

std::optional<CommandLine> ParseModelDirCommand(const char* command,
                                                const std::vector<std::string>& args,
                                                const std::set<std::string>& value_flags,
                                                const std::set<std::string>& switches,
                                                const char* usage) {
  absl::StatusOr<CommandLine> line = ParseCommandLine(args, value_flags, switches);
  if (line.ok() && line->overrides.empty()) return *line;
  std::cerr << "kappa " << command << ": "
            << (line.ok() ? "MODEL_DIR is required, and nothing else" : line.status().message())
            << "\n"
            << usage;
  return std::nullopt;
}

int ForEachJsonLine(const char* command, std::istream& in, std::ostream& out,
                    const std::function<std::string(const nlohmann::json&)>& process) {
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    // nlohmann's parse errors and `process`'s refusals (the tokenizer's too).
    absl::StatusOr<std::string> result =
        base::CaptureExceptions("", [&] { return process(nlohmann::json::parse(line)); });
    if (!result.ok()) {
      std::cerr << "kappa " << command << ": stdin line " << number << ": "
                << result.status().message() << "\n";
      return 1;
    }
    out << *result << "\n" << std::flush;
  }
  return 0;
}

}  // namespace kappa::cli
