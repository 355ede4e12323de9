// Reading what a `kappa run` leaves behind, for the end-to-end tests: whole
// files (logs, kappa's output) and metrics.jsonl records; and finding the
// run's processes, for the fault tests.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// The pid of the process whose command line contains `needle` (pgrep -f;
// `needle` is used as a regex, fine for paths and flags); 0 when none.
inline pid_t FindProcess(const std::string& needle) {
  FILE* pipe = popen(("pgrep -f -- '" + needle + "'").c_str(), "r");
  long pid = 0;
  if (pipe != nullptr) {
    if (fscanf(pipe, "%ld", &pid) != 1) pid = 0;
    pclose(pipe);
  }
  return static_cast<pid_t>(pid);
}

}  // namespace kappa::testing
