// Logging setup (spdlog): one line per event, "[time] [process] [level] msg",
// to stderr and, when given, to a log file. Call once at process start; then
// use spdlog::info/warn/error directly.
#pragma once

#include <string>

namespace kappa::services {

void InitLogging(const std::string& process_name, const std::string& log_file = "");

}  // namespace kappa::services
