// The reward of a "code" item (tasks/answer.h): the model's Python solution
// and the task's Python tests run together in the sandbox (verifier/sandbox.h);
// reward 1 iff the tests run to their end and the process exits 0 within the
// limits.
//
// The program is a fixed harness (kHarness in code_reward.cc) that executes
// solution.py, then tests.py, in one namespace with __name__ == "solution",
// then writes to the completion fd. So a solution's `if __name__ ==
// "__main__": sys.exit(main())`, a sys.exit(0) or an os._exit(0) before the
// tests ran scores 0 instead of passing vacuously; tests must not call
// sys.exit either (unittest.main(exit=False) is fine).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "verifier/sandbox.h"
#include "verifier/sandbox_slots.h"
#include "verifier/verifier_metrics.h"

namespace kappa::verifier {

struct CodeOptions {
  // kappa-verifier --enable-code; false: code items are refused
  // (FAILED_PRECONDITION naming --enable-code).
  bool enabled = false;
  // --allow-weak-sandbox: without it, a sandbox without full isolation
  // (SandboxIsolation::full(): not root, no namespaces, no seccomp, no run
  // cgroup) is not available() and kappa-verifier refuses to start; with it,
  // it runs with a warning naming what is missing.
  bool allow_weak_sandbox = false;
  int max_concurrent = 0;  // sandboxes at once, all calls together; 0: hardware threads
  size_t max_solution_bytes = 64 * 1024;  // response_text
  size_t max_tests_bytes = 256 * 1024;    // reference_answer
  // Run i of the concurrent runs (slot i) executes as uid/gid
  // slot_uid_base + i when the sandbox drops privileges (no passwd entry is
  // needed), so each run has its own RLIMIT_NPROC budget. 0: every run uses
  // sandbox.uid/gid.
  uid_t slot_uid_base = 61000;
  // Per-request cost budget (--code-request-seconds): a request's code items
  // × the wall timeout of one run, in sandbox-seconds. Over it:
  // RESOURCE_EXHAUSTED naming the flag.
  int64_t max_request_sandbox_seconds = 1200;
  SandboxOptions sandbox;
};

class CodeRewarder {
 public:
  // Probes the isolation this process can have and runs one known-good
  // program, logging what it found. available() fails when the sandbox
  // cannot run at all, or lacks full isolation without
  // options.allow_weak_sandbox (with it: a warning). `metrics` (not owned)
  // may be null.
  CodeRewarder(CodeOptions options, VerifierMetrics* metrics);
  CodeRewarder(const CodeRewarder&) = delete;
  CodeRewarder& operator=(const CodeRewarder&) = delete;

  // OK, or FAILED_PRECONDITION saying why code items cannot be scored here.
  const absl::Status& available() const { return available_; }
  // INVALID_ARGUMENT without a field name (callers prefix theirs).
  absl::Status ValidateTests(std::string_view tests) const;
  absl::Status ValidateResponse(std::string_view response) const;

  // Runs the solution extracted from `response` against `tests`; blocks for a
  // free slot first. Sandbox failures are outcome kError (reward 0), logged
  // and counted, never an exception.
  SandboxResult Run(std::string_view tests, std::string_view response);

  const SandboxIsolation& isolation() const { return isolation_; }
  int capacity() const { return capacity_; }

 private:
  SandboxResult RunUnlimited(std::string_view tests, std::string_view solution,
                             const SandboxOptions& sandbox) const;
  // The sandbox options of slot `slot` (its own uid; see slot_uid_base).
  SandboxOptions ForSlot(int slot) const;

  const CodeOptions options_;
  VerifierMetrics* const metrics_;
  SandboxIsolation isolation_;
  int capacity_ = 1;
  std::unique_ptr<SandboxSlots> slots_;
  absl::Status available_;
};

}  // namespace kappa::verifier
