// kappa_bench_generation --modes static,engine: the worker's two decode
// paths on one workload in one run (see generation_engine_bench.cc).
#pragma once

#include <string>
#include <vector>

namespace kappa::bench {

// "a,b,,c" -> {"a", "b", "c"}: the benches' comma-separated flag values.
std::vector<std::string> SplitCommaList(const std::string& text);

// True when --modes names static or engine (the comparison below runs then).
bool WantsEngineComparison(int argc, char** argv);
// Runs the comparison; returns the process exit code.
int RunEngineComparison(int argc, char** argv);

}  // namespace kappa::bench
