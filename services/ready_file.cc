#include "services/ready_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/atomic_file.h"

namespace kappa::services {

std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  const bool has_port = colon != std::string::npos && address.find(']', colon) == std::string::npos;
  return absl::StrCat(has_port ? address.substr(0, colon) : address, ":", port);
}

absl::Status WriteReadyFile(const std::string& path, const ReadyInfo& info) {
  if (path.empty()) return absl::OkStatus();
  const nlohmann::json record = {
      {"pid", info.pid}, {"address", info.address}, {"metrics_address", info.metrics_address}};
  return WriteFileAtomically(path, record.dump() + "\n");
}

absl::StatusOr<ReadyInfo> ReadReadyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": not written yet"));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json record =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("pid") || !record["pid"].is_number_integer() ||
      !record.contains("address") || !record["address"].is_string() ||
      !record.contains("metrics_address") || !record["metrics_address"].is_string()) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a ready file (want {\"pid\", \"address\", \"metrics_address\"}), got: ",
        text.str().substr(0, 200)));
  }
  ReadyInfo info;
  info.pid = record["pid"].get<int64_t>();
  info.address = record["address"].get<std::string>();
  info.metrics_address = record["metrics_address"].get<std::string>();
  return info;
}

}  // namespace kappa::services
