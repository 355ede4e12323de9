// kappa.v1.Verifier: one exact-answer reward per item (tasks/answer.h), so the
// learner's held-out evaluation and the verifier agree by construction.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kappa/v1/verifier.grpc.pb.h"
#include "verifier/verifier_metrics.h"

namespace kappa::verifier {

struct VerifierOptions {
  int64_t max_items = 4096;  // per request (config verifier.max_items)
};

// Rewards for every item, in order; or INVALID_ARGUMENT naming the first bad
// field ("items[3].reference_answer: ..."), in which case no item is scored.
absl::StatusOr<std::vector<float>> ScoreRequest(const kappa::v1::VerifyRequest& request,
                                                const VerifierOptions& options);

class VerifierService final : public kappa::v1::Verifier::Service {
 public:
  // `metrics` (not owned) may be null: nothing is recorded.
  explicit VerifierService(VerifierOptions options, VerifierMetrics* metrics = nullptr)
      : options_(options), metrics_(metrics) {}

  grpc::Status Verify(grpc::ServerContext* context, const kappa::v1::VerifyRequest* request,
                      kappa::v1::VerifyResponse* response) override;

 private:
  const VerifierOptions options_;
  VerifierMetrics* const metrics_;
};

}  // namespace kappa::verifier
