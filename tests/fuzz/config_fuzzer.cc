// Fuzzes the run configuration loader (services/config.h): the input is
// "<yaml text>\0<override>\0<override>..." and goes to ParseConfig. Errors must
// be statuses (no exception or crash), and an accepted config must survive
// ConfigToYaml -> ParseConfig unchanged, as config.h promises (`kappa run
// --resume` reads back the config.yaml it wrote).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "services/config.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts = absl::StrSplit(input, '\0');
  const std::string yaml = parts.front();
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());

  const absl::StatusOr<kappa::services::Config> config =
      kappa::services::ParseConfig(yaml, "fuzz.yaml", overrides);
  if (!config.ok()) {
    Check(config.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const std::string written = kappa::services::ConfigToYaml(*config);
  const absl::StatusOr<kappa::services::Config> again =
      kappa::services::ParseConfig(written, "written.yaml");
  Check(again.ok());
  Check(kappa::services::ConfigToYaml(*again) == written);
  return 0;
}
