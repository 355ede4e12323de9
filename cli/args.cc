#include "cli/args.h"

#include "absl/strings/str_cat.h"

namespace kappa::cli {

std::string CommandLine::Get(const std::string& flag, const std::string& fallback) const {
  auto it = flags.find(flag);
  return it == flags.end() ? fallback : it->second;
}

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                             const std::set<std::string>& value_flags,
                                             const std::set<std::string>& switch_flags) {
  CommandLine line;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      const std::string name = arg.substr(0, eq);
      if (value_flags.count(name) > 0) {
        if (eq != std::string::npos) {
          line.flags[name] = arg.substr(eq + 1);
        } else if (i + 1 < args.size()) {
          line.flags[name] = args[++i];
        } else {
          return absl::InvalidArgumentError(absl::StrCat("flag ", name, " needs a value"));
        }
      } else if (switch_flags.count(name) > 0) {
        if (eq != std::string::npos) {
          return absl::InvalidArgumentError(absl::StrCat("flag ", name, " takes no value"));
        }
        line.flags[name] = "";
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "'"));
      }
    } else if (arg.find('=') != std::string::npos) {
      line.overrides.push_back(arg);
    } else if (line.config_path.empty()) {
      line.config_path = arg;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument '", arg, "' (the config is already '", line.config_path,
          "'; overrides look like key=value)"));
    }
  }
  if (line.config_path.empty()) {
    return absl::InvalidArgumentError("missing CONFIG (a YAML file, e.g. configs/demo.yaml)");
  }
  return line;
}

}  // namespace kappa::cli
