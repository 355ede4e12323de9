// Command-line parsing shared by the `kappa` subcommands:
//   kappa <sub> CONFIG [key=value ...] [--flag [VALUE] | --flag=VALUE ...]
// Flags and overrides may come in any order after the subcommand.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kappa::cli {

struct CommandLine {
  std::string config_path;
  std::vector<std::string> overrides;        // "a.b=value", in order
  std::map<std::string, std::string> flags;  // "--out" -> "dir"; switches map to ""

  bool Has(const std::string& flag) const { return flags.count(flag) > 0; }
  std::string Get(const std::string& flag, const std::string& fallback = "") const;
};

// `value_flags` take a value ("--out DIR" or "--out=DIR"); `switch_flags`
// take none. Errors (INVALID_ARGUMENT) name the offending argument: unknown
// flag, missing value, a second CONFIG, no CONFIG.
absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                             const std::set<std::string>& value_flags,
                                             const std::set<std::string>& switch_flags);

}  // namespace kappa::cli
