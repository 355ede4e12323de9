// kappa config-reference: prints the configuration reference, every key of
// the run configuration with its type, default and description
// (services::ConfigReferenceMarkdown), to stdout. docs/configuration.md is
// its output:
//   build/cli/kappa config-reference > docs/configuration.md
// Exit status: 0 done; 1 stdout could not be written; 2 bad arguments (it
// takes none).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace kappa::cli {

int ConfigReferenceCommand(const std::vector<std::string>& args, std::ostream& out);

}  // namespace kappa::cli
