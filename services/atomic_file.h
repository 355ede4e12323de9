// Writing a file so that no reader ever sees half of it: the run directory's
// config, checkpoint markers, summaries and reports are read while (or after)
// another process writes them, or after a kill in the middle.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace kappa::services {

// Writes `contents` to a temporary file beside `path` (named with this
// process's pid, so two writers never share one), fsyncs it, and renames it
// over `path`. INTERNAL naming the file on failure; `path` is then untouched.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace kappa::services
