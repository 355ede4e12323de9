#include "cli/report_command.h"

#include <iostream>

#include "cli/report_run.h"

namespace kappa::cli {
namespace {

constexpr const char* kUsage = "usage: kappa report RUN_DIR [--out FILE]\n";

}  // namespace

int ReportCommand(const std::vector<std::string>& args) {
  // Not ParseCommandLine: its positional argument is a CONFIG and its
  // messages say so; here it is a run directory.
  std::string run_dir;
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    std::string problem;
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--out") {
      if (i + 1 == args.size()) {
        problem = "--out needs a value";
      } else {
        out = args[++i];
      }
    } else if (arg.rfind("--out=", 0) == 0) {
      out = arg.substr(6);
    } else if (arg.rfind("-", 0) == 0) {
      problem = "unknown flag '" + arg + "'";
    } else if (!run_dir.empty()) {
      problem = "unexpected argument '" + arg + "' (RUN_DIR is already '" + run_dir + "')";
    } else {
      run_dir = arg;
    }
    if (!problem.empty()) {
      std::cerr << "kappa report: " << problem << "\n" << kUsage;
      return 2;
    }
  }
  if (run_dir.empty()) {
    std::cerr << "kappa report: missing RUN_DIR (e.g. runs/demo)\n" << kUsage;
    return 2;
  }
  absl::StatusOr<RunReportOutcome> outcome = WriteRunReport(run_dir, out);
  if (!outcome.ok()) {
    std::cerr << "kappa report: " << outcome.status().message() << "\n";
    return 1;
  }
  for (const std::string& problem : outcome->problems) {
    std::cerr << "kappa report: warning: " << problem << "\n";
  }
  std::cerr << "kappa report: wrote " << outcome->path << " (" << outcome->steps << " steps";
  if (outcome->skipped_lines > 0) {
    std::cerr << "; " << outcome->skipped_lines << " malformed line"
              << (outcome->skipped_lines == 1 ? "" : "s") << " skipped";
  }
  std::cerr << ")\n";
  return 0;
}

}  // namespace kappa::cli
