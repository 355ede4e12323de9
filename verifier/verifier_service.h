// kappa.v1.Verifier: one exact-answer reward per item (tasks/answer.h), so the
// learner's held-out evaluation and the verifier agree by construction; "code"
// items are run in the sandbox instead (verifier/code_reward.h). The item's
// task field picks the reward, unless verifier.reward names one for every
// item (VerifierOptions::reward_family).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kappa/v1/verifier.grpc.pb.h"
#include "services/config.h"
#include "verifier/code_reward.h"
#include "verifier/code_tasks.h"
#include "verifier/verifier_metrics.h"

namespace kappa::verifier {

struct VerifierOptions {
  int64_t max_items = 4096;  // per request (config verifier.max_items)
  // The task family every item is scored as, whatever its own task field
  // (config verifier.reward, through tasks::RewardFamily: "exact" is
  // "arithmetic"); nullopt: each item's own family.
  std::optional<std::string> reward_family;
  CodeOptions code;  // "code" items (flags --enable-code, --code-* of kappa-verifier)
  // The code tasks' tests loaded at start-up (--code-tasks); null: none. A
  // code item whose example_id is here runs these tests.
  std::shared_ptr<const CodeTasks> code_tasks;
  // Whether the server authenticates its callers
  // (services::TransportSecurity::AuthenticatesClients(): mutual TLS or
  // tokens, checked before any handler runs). Only then may a code item
  // bring its own tests in reference_answer.
  bool callers_authenticated = false;
};

// Sets max_items and reward_family from the configuration's verifier.* keys.
// INVALID_ARGUMENT naming the key: "verifier.reward: unknown reward 'x'
// (known: ...)", or "verifier.reward: 'code' runs code in the sandbox, which
// is off; pass --enable-code ..." when options->code.enabled is false (so
// apply the code options first).
absl::Status ApplyVerifierConfig(const services::Config& config, VerifierOptions* options);

// Rewards for every item, in order; or INVALID_ARGUMENT naming the first bad
// field ("items[3].reference_answer: ..."), in which case no item is scored.
// An item's family is options.reward_family when set (its task field is then
// ignored, unchecked), else its task field. Code items need `code`
// (FAILED_PRECONDITION naming items[i].task, or verifier.reward when that
// chose code, and --enable-code when it is null, or why it is unavailable);
// they run concurrently, up to code->capacity() at once. A code item runs the
// tests of its example_id in options.code_tasks (its reference_answer must
// be empty or the same, else INVALID_ARGUMENT); an item without such an id
// runs its own reference_answer only when options.callers_authenticated,
// else PERMISSION_DENIED naming items[i].reference_answer.
// The request's code items × options.code.sandbox.wall_timeout over
// options.code.max_request_sandbox_seconds: RESOURCE_EXHAUSTED naming
// --code-request-seconds. `stop` (may be empty) is asked before each code
// item starts: a status other than OK (the call's deadline passed, its
// caller went away) ends the request with it; runs already started finish
// (each within its wall timeout) and their results are dropped.
absl::StatusOr<std::vector<float>> ScoreRequest(
    const kappa::v1::VerifyRequest& request, const VerifierOptions& options,
    CodeRewarder* code = nullptr, const std::function<absl::Status()>& stop = nullptr);

class VerifierService final : public kappa::v1::Verifier::Service {
 public:
  // `metrics` (not owned) may be null: nothing is recorded. With
  // options.code.enabled this probes and self-checks the code sandbox (forks
  // a few short-lived children) and logs what it found.
  explicit VerifierService(VerifierOptions options, VerifierMetrics* metrics = nullptr);

  grpc::Status Verify(grpc::ServerContext* context, const kappa::v1::VerifyRequest* request,
                      kappa::v1::VerifyResponse* response) override;

  // OK when code items are disabled or can be scored; else why not (the
  // sandbox failed its self-check, or lacks full isolation without
  // --allow-weak-sandbox): kappa-verifier then refuses to start.
  absl::Status CodeStatus() const;

 private:
  const VerifierOptions options_;
  VerifierMetrics* const metrics_;
  std::unique_ptr<CodeRewarder> code_;  // null when code items are disabled
};

}  // namespace kappa::verifier
