#include "cli/metrics_tail.h"

#include <fstream>

namespace kappa::cli {

std::vector<nlohmann::json> MetricsTail::ReadNew() {
  std::vector<nlohmann::json> records;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return records;
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  if (size < offset_) {  // truncated or replaced: start over
    offset_ = 0;
    partial_.clear();
  }
  if (size == offset_) return records;
  in.seekg(static_cast<std::streamoff>(offset_));
  std::string chunk(size - offset_, '\0');
  in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  chunk.resize(static_cast<size_t>(in.gcount()));
  offset_ += chunk.size();
  partial_ += chunk;

  size_t start = 0;
  for (size_t nl = partial_.find('\n'); nl != std::string::npos;
       nl = partial_.find('\n', start)) {
    const std::string line = partial_.substr(start, nl - start);
    start = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object()) {
      records.push_back(std::move(record));
    } else {
      ++skipped_lines_;
    }
  }
  partial_.erase(0, start);
  return records;
}

}  // namespace kappa::cli
