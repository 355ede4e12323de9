#include "cli/config_reference_command.h"

#include <iostream>

#include "services/config.h"

namespace kappa::cli {

int ConfigReferenceCommand(const std::vector<std::string>& args, std::ostream& out) {
  if (!args.empty()) {
    std::cerr << "kappa config-reference: takes no arguments, got '" << args.front() << "'\n"
              << "usage: kappa config-reference > docs/configuration.md\n";
    return 2;
  }
  out << services::ConfigReferenceMarkdown();
  out.flush();
  if (!out) {
    std::cerr << "kappa config-reference: cannot write to stdout\n";
    return 1;
  }
  return 0;
}

}  // namespace kappa::cli
