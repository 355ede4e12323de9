// Reading what a `kappa run` leaves behind, for the end-to-end tests: whole
// files (logs, kappa's output) and metrics.jsonl records.
#pragma once

#include <filesystem>
#include <fstream>
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

}  // namespace kappa::testing
