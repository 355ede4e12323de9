// `kappa report RUN_DIR [--out FILE]`: writes RUN_DIR/report.html (or FILE),
// a self-contained page of the run's curves, alarms and config.
#pragma once

#include <string>
#include <vector>

namespace kappa::cli {

// Exit status: 0 written (also when malformed lines were skipped: they are
// listed on stderr and on the page), 1 no metrics.jsonl or write failure,
// 2 usage.
int ReportCommand(const std::vector<std::string>& args);

}  // namespace kappa::cli
