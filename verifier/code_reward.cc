#include "verifier/code_reward.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "tasks/answer.h"

namespace kappa::verifier {
namespace {

// Runs in the sandbox as `python3 -I -S -B kappa_main.py`. Names start with
// _kappa so the solution's globals do not collide with them (the solution
// can still see and change them: this guards against accidents, not against
// code written to game the harness; see docs/security.md).
constexpr char kHarness[] = R"py(import os as _kappa_os
import sys as _kappa_sys


def _kappa_load(name):
    with open(name, encoding="utf-8") as f:
        return compile(f.read(), name, "exec")


_kappa_ns = {"__name__": "solution", "__builtins__": __builtins__}
try:
    exec(_kappa_load("solution.py"), _kappa_ns)
    _kappa_tests = _kappa_load("tests.py")
    exec(_kappa_tests, _kappa_ns)
except SystemExit as _kappa_exit:
    _kappa_sys.exit("kappa: sys.exit(%r) before the tests finished" % (_kappa_exit.code,))
_kappa_sys.stdout.flush()
_kappa_os.write(3, b"done")
)py";

// Lines of the tails that make it into a log line.
std::string LogTail(const std::string& text) {
  constexpr size_t kMax = 2048;
  return text.size() <= kMax ? text : absl::StrCat("...", text.substr(text.size() - kMax));
}

}  // namespace

CodeRewarder::CodeRewarder(CodeOptions options, VerifierMetrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {
  capacity_ = options_.max_concurrent > 0
                  ? options_.max_concurrent
                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  slots_ = std::make_unique<SandboxSlots>(capacity_);
  isolation_ = ProbeSandboxIsolation();
  if (isolation_.full()) {
    spdlog::info(
        "code sandbox: full isolation ({}); uid {}, {} at once, limits: {} s CPU, {} s "
        "wall, {} MiB address space per process, {} MiB per run",
        isolation_.ToString(), ForSlot(0).uid, capacity_, options_.sandbox.cpu_seconds,
        absl::ToDoubleSeconds(options_.sandbox.wall_timeout),
        options_.sandbox.address_space_bytes >> 20, options_.sandbox.run_memory_bytes >> 20);
  } else if (!options_.allow_weak_sandbox) {
    available_ = absl::FailedPreconditionError(absl::StrCat(
        "the code sandbox lacks full isolation (", isolation_.ToString(), ")",
        geteuid() != 0 ? " because the verifier is not running as root" : "",
        "; run the verifier as root with cgroups it can write (docs/security.md), or pass "
        "--allow-weak-sandbox to score code in the weaker sandbox"));
    spdlog::error("{}", std::string(available_.message()));
    return;
  } else {
    spdlog::warn(
        "code sandbox is WEAKER than intended ({}){}: rlimits, the wall-clock timeout, "
        "the empty work dir, the closed fds and the clean environment still apply "
        "(--allow-weak-sandbox); see docs/security.md",
        isolation_.ToString(),
        geteuid() != 0 ? " because the verifier is not running as root" : "");
  }
  // One known-good run: a missing interpreter or an unusable work root shows
  // now, in the log and as FAILED_PRECONDITION, not as silent zero rewards.
  const SandboxResult check =
      RunUnlimited("assert f() == 1\n", "def f():\n    return 1\n", ForSlot(0));
  if (check.outcome != SandboxResult::Outcome::kPass) {
    available_ = absl::FailedPreconditionError(
        absl::StrCat("the code sandbox failed its self-check: ", check.Summary(), " ",
                     LogTail(check.stderr_tail)));
    spdlog::error("{}", std::string(available_.message()));
  }
}

absl::Status CodeRewarder::ValidateTests(std::string_view tests) const {
  if (tests.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return absl::InvalidArgumentError("code tests are empty");
  }
  if (tests.size() > options_.max_tests_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(tests.size(), " bytes exceed the limit of ",
                                                   options_.max_tests_bytes));
  }
  return absl::OkStatus();
}

absl::Status CodeRewarder::ValidateResponse(std::string_view response) const {
  if (response.size() > options_.max_solution_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(response.size(), " bytes exceed the limit of ",
                                                   options_.max_solution_bytes));
  }
  return absl::OkStatus();
}

SandboxResult CodeRewarder::Run(std::string_view tests, std::string_view response) {
  SandboxResult result;
  {
    SandboxSlots::Lease lease(*slots_);
    result = RunUnlimited(tests, tasks::ExtractPythonCode(response), ForSlot(lease.index()));
  }
  if (metrics_ != nullptr) metrics_->RecordSandboxRun(OutcomeName(result.outcome), result.seconds);
  if (result.outcome == SandboxResult::Outcome::kError) {
    spdlog::error("code sandbox run failed: {}", result.Summary());
  } else {
    spdlog::debug("code sandbox: {}; stderr: {}", result.Summary(), LogTail(result.stderr_tail));
  }
  return result;
}

SandboxOptions CodeRewarder::ForSlot(int slot) const {
  SandboxOptions sandbox = options_.sandbox;
  if (options_.slot_uid_base != 0) {
    sandbox.uid = options_.slot_uid_base + static_cast<uid_t>(slot);
    sandbox.gid = static_cast<gid_t>(sandbox.uid);
  }
  return sandbox;
}

SandboxResult CodeRewarder::RunUnlimited(std::string_view tests, std::string_view solution,
                                         const SandboxOptions& sandbox) const {
  const std::vector<std::pair<std::string, std::string>> files = {
      {"kappa_main.py", kHarness},
      {"solution.py", std::string(solution)},
      {"tests.py", std::string(tests)},
  };
  absl::StatusOr<SandboxResult> result =
      RunSandboxed(files, "kappa_main.py", sandbox, isolation_);
  if (result.ok()) return *std::move(result);
  SandboxResult failed;  // outcome kError
  failed.error = std::string(result.status().message());
  return failed;
}

}  // namespace kappa::verifier
