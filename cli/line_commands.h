// What the stdin-to-stdout `kappa` subcommands (tokenize, detokenize,
// render-prompt) share: MODEL_DIR-only command lines and one JSON value per
// line in, one result per line out.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <iosfwd>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/args.h"

namespace kappa::cli {

// MODEL_DIR plus the given flags; on error prints the message and `usage` to
// stderr and returns nullopt.
std::optional<CommandLine> ParseModelDirCommand(const char* command,
                                                const std::vector<std::string>& args,
                                                const std::set<std::string>& value_flags,
                                                const std::set<std::string>& switches,
                                                const char* usage);

// Parses each stdin line as JSON, prints `process`'s result on its own line
// and flushes it; stops at the first line that is not JSON or that `process`
// throws on, naming the line on stderr. Returns the exit status (0, or 1).
int ForEachJsonLine(const char* command, std::istream& in, std::ostream& out,
                    const std::function<std::string(const nlohmann::json&)>& process);

}  // namespace kappa::cli
