// Reading what a `kappa run` leaves behind, for the end-to-end tests: whole
// files (logs, kappa's output) and metrics.jsonl records; and finding the
// run's processes, for the fault tests.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace kappa::testing {

// Empty when the file cannot be read.
inline std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The complete lines of metrics.jsonl so far; a line still being written (a
// running learner) is skipped, not an error.
inline std::vector<nlohmann::json> StepRecords(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_discarded()) records.push_back(std::move(record));
  }
  return records;
}

// Training steps logged so far (the step-0 evaluation line not counted).
inline int CountTrainedSteps(const std::filesystem::path& metrics) {
  int steps = 0;
  for (const nlohmann::json& record : StepRecords(metrics)) {
    if (record.value("step", 0) > 0) ++steps;
  }
  return steps;
}

// What a run trained on: the steps logged (the step-0 evaluation line not
// counted), every lease id consumed, and the ids consumed more than once.
struct TrainedGroups {
  int steps = 0;
  std::set<std::string> leases;
  std::vector<std::string> repeated;
};
inline TrainedGroups ReadTrainedGroups(const std::filesystem::path& metrics) {
  TrainedGroups trained;
  for (const nlohmann::json& record : StepRecords(metrics)) {
    if (record.value("step", 0) == 0) continue;
    ++trained.steps;
    for (const auto& id : record["lease_ids"]) {
      if (!trained.leases.insert(id.get<std::string>()).second) {
        trained.repeated.push_back(id.get<std::string>());
      }
    }
  }
  return trained;
}

// The pid of the one process whose command line (its arguments joined by
// spaces) contains `needle`, read from /proc; 0 when none does. Not pgrep -f
// through popen: Debian's /bin/sh (dash) does not exec its last command, so
// the `sh -c "pgrep ... needle"` shell matches too, and once pids wrap around
// (pid_max is 32768 on a long CI run) that short-lived shell can sort first.
inline pid_t FindProcess(const std::string& needle) {
  const pid_t self = getpid();
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == self) continue;
    std::string command_line = ReadAll(entry.path() / "cmdline");
    for (char& c : command_line) {
      if (c == '\0') c = ' ';
    }
    if (command_line.find(needle) != std::string::npos) return pid;
  }
  return 0;
}

}  // namespace kappa::testing
