// metrics.jsonl: one JSON object per line, appended and flushed per step so
// `kappa run`'s progress display and later tools can tail it while training.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace kappa::learner {

class MetricsLog {
 public:
  // Appends to `path` (a resumed run continues the same file).
  explicit MetricsLog(const std::string& path);
  void Write(const nlohmann::json& record);

 private:
  std::ofstream out_;
};

}  // namespace kappa::learner
