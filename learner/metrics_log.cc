#include "learner/metrics_log.h"

#include <stdexcept>

namespace kappa::learner {

MetricsLog::MetricsLog(const std::string& path) : out_(path, std::ios::app) {
  if (!out_) throw std::runtime_error("cannot open " + path + " for appending");
}

void MetricsLog::Write(const nlohmann::json& record) {
  // NaN is not JSON; nlohmann writes it as null, which readers must accept.
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace kappa::learner
