// Follows a growing JSONL file (the learner's metrics.jsonl) the way `tail -f`
// does: each call returns the records of the lines completed since the last
// call. A line still being written is kept until its newline arrives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kappa::cli {

class MetricsTail {
 public:
  explicit MetricsTail(std::string path) : path_(std::move(path)) {}

  // New complete records; nothing (not an error) while the file does not
  // exist yet. Lines that are not JSON objects are skipped and counted.
  std::vector<nlohmann::json> ReadNew();
  int64_t skipped_lines() const { return skipped_lines_; }

 private:
  std::string path_;
  uint64_t offset_ = 0;
  std::string partial_;
  int64_t skipped_lines_ = 0;
};

}  // namespace kappa::cli
