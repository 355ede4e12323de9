#include "services/logging.h"

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace kappa::services {
namespace {

// The process name goes into the pattern literally, so escape '%'.
std::string EscapePattern(const std::string& text) {
  std::string escaped;
  for (char c : text) {
    if (c == '%') escaped += '%';
    escaped += c;
  }
  return escaped;
}

void LogPeakResidentMemory() {
  const long long bytes = PeakResidentBytes();
  spdlog::info("peak RSS {} MiB (peak_rss_bytes={})", bytes >> 20, bytes);
}

}  // namespace

long long PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kib) == 1) return kib * 1024;
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<long long>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

void InitLogging(const std::string& process_name, const std::string& log_file) {
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  std::string file_error;
  if (!log_file.empty()) {
    try {
      sinks.push_back(
          std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_file, /*truncate=*/false));
    } catch (const spdlog::spdlog_ex& e) {
      file_error = e.what();  // keep logging to stderr rather than die
    }
  }
  auto logger = std::make_shared<spdlog::logger>(process_name, sinks.begin(), sinks.end());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + EscapePattern(process_name) + "] [%l] %v");
  // Logs are read live (tail -f, docker logs): flush at info and above.
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug etc.
  if (!file_error.empty()) {
    spdlog::warn("cannot open log file '{}': {}; logging to stderr only", log_file, file_error);
  }
  // spdlog's registry was constructed above, before this registration, so it
  // outlives the handler.
  static bool registered = false;
  if (!registered) {
    registered = true;
    std::atexit(LogPeakResidentMemory);
  }
}

}  // namespace kappa::services
