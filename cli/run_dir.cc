#include "cli/run_dir.h"

#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "services/atomic_file.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;

std::string Timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d-%H%M%S", &tm);
  return buffer;
}

}  // namespace

absl::StatusOr<std::string> MoveAsideIfNonEmpty(const std::string& dir_text,
                                                const std::string& what) {
  const fs::path dir = dir_text;
  std::error_code ec;
  if (!fs::exists(dir) || fs::is_empty(dir, ec)) return std::string();
  fs::path aside = dir;
  aside += "." + Timestamp();
  for (int i = 1; fs::exists(aside); ++i) {
    aside = dir;
    aside += absl::StrCat(".", Timestamp(), "-", i);
  }
  fs::rename(dir, aside, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot move the previous ", what, " ", dir.string(), " aside: ", ec.message()));
  }
  return aside.string();
}

absl::StatusOr<std::string> PrepareRunDir(const services::Config& config, bool resume,
                                          std::ostream& log) {
  if (config.name.empty() || config.name == "." || config.name == ".." ||
      config.name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name '", config.name, "' must be a plain directory name (the run goes to runs_dir/name)"));
  }
  std::error_code ec;
  const fs::path dir = fs::absolute(fs::path(config.runs_dir) / config.name, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("runs_dir: ", ec.message()));
  if (!resume) {
    absl::StatusOr<std::string> aside = MoveAsideIfNonEmpty(dir.string(), "run");
    if (!aside.ok()) return aside.status();
    if (!aside->empty()) {
      log << "previous run " << dir.string() << " moved to " << *aside
          << " (pass --resume to continue a run instead)\n";
    }
  }

  fs::create_directories(dir / "logs", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", (dir / "logs").string(), ": ", ec.message()));
  }
  return dir.string();
}

absl::Status WriteResolvedConfig(const services::Config& config, const std::string& path) {
  return services::WriteFileAtomically(path,
                             absl::StrCat("# Resolved by `kappa run` (config file + overrides + "
                                          "chosen ports);\n# every process of this run reads "
                                          "this file.\n",
                                          services::ConfigToYaml(config)));
}

}  // namespace kappa::cli
