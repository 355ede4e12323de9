#include "cli/sft_command.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "absl/strings/str_format.h"
#include "cli/args.h"
#include "learner/sft_warm_start.h"
#include "services/config.h"

namespace kappa::cli {

int SftCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CommandLine> line = ParseCommandLine(args, {"--role", "--out"}, {});
  if (!line.ok()) {
    std::cerr << "kappa sft: " << line.status().message()
              << "\nusage: kappa sft CONFIG [key=value ...] --role teacher|student [--out DIR]\n";
    return 2;
  }
  if (!line->Has("--role")) {
    std::cerr << "kappa sft: --role teacher|student is required\n";
    return 2;
  }
  absl::StatusOr<learner::Role> role = learner::ParseRole(line->Get("--role"));
  if (!role.ok()) {
    std::cerr << "kappa sft: " << role.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::vector<std::string>> overrides =
      services::WithEnvironmentOverrides(line->overrides, environ);
  if (!overrides.ok()) {
    std::cerr << "kappa sft: " << overrides.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<services::Config> config = services::LoadConfig(line->config_path, *overrides);
  if (!config.ok()) {
    std::cerr << "kappa sft: " << config.status().message() << "\n";
    return 1;
  }
  const std::string out = line->Get(
      "--out", (std::filesystem::path(config->data_dir) / learner::RoleName(*role)).string());
  absl::StatusOr<learner::SftResult> result = learner::RunSft(*config, *role, out, std::cout);
  if (!result.ok()) {
    std::cerr << "kappa sft: " << result.status().message() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "%s: held-out accuracy %.3f (was %.3f) after %d steps, loss %.4f, %.1f s\n"
      "checkpoint: %s\n",
      learner::RoleName(*role), result->accuracy, result->accuracy_before, result->steps,
      result->loss, result->seconds, out);
  return 0;
}

}  // namespace kappa::cli
