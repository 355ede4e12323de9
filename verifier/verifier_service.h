// kappa.v1.Verifier: one exact-answer reward per item (tasks/answer.h), so the
// learner's held-out evaluation and the verifier agree by construction; "code"
// items are run in the sandbox instead (verifier/code_reward.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kappa/v1/verifier.grpc.pb.h"
#include "verifier/code_reward.h"
#include "verifier/verifier_metrics.h"

namespace kappa::verifier {

struct VerifierOptions {
  int64_t max_items = 4096;  // per request (config verifier.max_items)
  CodeOptions code;          // "code" items (flags --code-* of kappa-verifier)
};

// Rewards for every item, in order; or INVALID_ARGUMENT naming the first bad
// field ("items[3].reference_answer: ..."), in which case no item is scored.
// Code items need `code` (FAILED_PRECONDITION naming items[i].task when it is
// null or unavailable); they run concurrently, up to code->capacity() at once.
absl::StatusOr<std::vector<float>> ScoreRequest(const kappa::v1::VerifyRequest& request,
                                                const VerifierOptions& options,
                                                CodeRewarder* code = nullptr);

class VerifierService final : public kappa::v1::Verifier::Service {
 public:
  // `metrics` (not owned) may be null: nothing is recorded. With
  // options.code.enabled this probes and self-checks the code sandbox (forks
  // a few short-lived children) and logs what it found.
  explicit VerifierService(VerifierOptions options, VerifierMetrics* metrics = nullptr);

  grpc::Status Verify(grpc::ServerContext* context, const kappa::v1::VerifyRequest* request,
                      kappa::v1::VerifyResponse* response) override;

 private:
  const VerifierOptions options_;
  VerifierMetrics* const metrics_;
  std::unique_ptr<CodeRewarder> code_;  // null when code items are disabled
};

}  // namespace kappa::verifier
