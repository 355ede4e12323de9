// kappa_bench_generation --modes engine: the worker's decode engine on a
// ragged workload (see generation_engine_bench.cc).
#pragma once

#include <string>
#include <vector>

namespace kappa::bench {

// "a,b,,c" -> {"a", "b", "c"}: the benches' comma-separated flag values.
std::vector<std::string> SplitCommaList(const std::string& text);

// True when --modes names engine (or the retired static, refused by
// RunEngineComparison).
bool WantsEngineComparison(int argc, char** argv);
// Runs the engine bench; returns the process exit code (2: bad flags or
// --modes static).
int RunEngineComparison(int argc, char** argv);

}  // namespace kappa::bench
