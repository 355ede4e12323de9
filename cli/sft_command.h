// `kappa sft CONFIG [key=value ...] --role teacher|student [--out DIR]`
#pragma once

#include <string>
#include <vector>

namespace kappa::cli {

// args: everything after "sft". Returns the process exit code.
int SftCommand(const std::vector<std::string>& args);

}  // namespace kappa::cli
