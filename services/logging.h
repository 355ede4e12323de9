// Logging setup (spdlog): one line per event, "[time] [process] [level] msg",
// to stderr and, when given, to a log file. Call once at process start; then
// use spdlog::info/warn/error directly.
//
// At exit (return from main or exit(), not a signal death or _exit) the
// process logs its peak resident memory once, as
// "peak RSS <MiB> MiB (peak_rss_bytes=<bytes>)": the number `kappa plan` is
// checked against and docs/results.md's per-process table records.
#pragma once

#include <string>

namespace kappa::services {

// The most resident memory this process's own image has held so far, in
// bytes: VmHWM from /proc/self/status. Not getrusage's ru_maxrss: Linux
// carries that across fork and exec, so a process `kappa run` started
// would report at least the launcher's resident memory at the fork.
// Falls back to ru_maxrss where /proc is not mounted.
long long PeakResidentBytes();

void InitLogging(const std::string& process_name, const std::string& log_file = "");

}  // namespace kappa::services
