// `kappa run CONFIG [key=value ...] [--resume] [--no-progress]`: the whole
// local system on one machine (see run_session.h for the supervised part).
#pragma once

#include <string>
#include <vector>

namespace kappa::cli {

// args: everything after "run". Returns the process exit code: 0 done,
// 1 failed (config error, bootstrap error, a process died), 2 usage,
// 130 interrupted.
int RunCommand(const std::vector<std::string>& args);

}  // namespace kappa::cli
