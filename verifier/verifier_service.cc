#include "verifier/verifier_service.h"

#include <exception>
#include <string>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/grpc_util.h"
#include "tasks/answer.h"
#include "verifier/utf8.h"

namespace kappa::verifier {
namespace {

absl::Status FieldError(int index, const char* field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("items[", index, "].", field, ": ", message));
}

absl::Status ValidateItem(const kappa::v1::VerifyItem& item, int index) {
  // Proto3 parsing already rejects invalid UTF-8 in string fields on the wire;
  // these checks also cover in-process callers.
  if (!IsValidUtf8(item.task())) return FieldError(index, "task", "not valid UTF-8");
  if (absl::Status status = tasks::ValidateTask(item.task()); !status.ok()) {
    return FieldError(index, "task", status.message());
  }
  if (!IsValidUtf8(item.reference_answer())) {
    return FieldError(index, "reference_answer", "not valid UTF-8");
  }
  if (absl::Status status = tasks::ValidateReference(item.task(), item.reference_answer());
      !status.ok()) {
    return FieldError(index, "reference_answer", status.message());
  }
  if (!IsValidUtf8(item.response_text())) {
    return FieldError(index, "response_text", "not valid UTF-8");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> ScoreRequest(const kappa::v1::VerifyRequest& request,
                                                const VerifierOptions& options) {
  if (request.items_size() == 0) return absl::InvalidArgumentError("items: empty request");
  if (request.items_size() > options.max_items) {
    return absl::InvalidArgumentError(absl::StrCat("items: ", request.items_size(),
                                                   " items exceed the limit of ",
                                                   options.max_items, " per request"));
  }
  // Validate everything first: a malformed item fails the whole request.
  for (int i = 0; i < request.items_size(); ++i) {
    if (absl::Status status = ValidateItem(request.items(i), i); !status.ok()) return status;
  }
  std::vector<float> rewards;
  rewards.reserve(request.items_size());
  for (int i = 0; i < request.items_size(); ++i) {
    const kappa::v1::VerifyItem& item = request.items(i);
    absl::StatusOr<float> reward =
        tasks::ExactAnswerReward(item.task(), item.reference_answer(), item.response_text());
    if (!reward.ok()) return FieldError(i, "reference_answer", reward.status().message());
    rewards.push_back(*reward);
  }
  return rewards;
}

grpc::Status VerifierService::Verify(grpc::ServerContext*, const kappa::v1::VerifyRequest* request,
                                     kappa::v1::VerifyResponse* response) {
  try {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<float>> rewards = ScoreRequest(*request, options_);
    if (metrics_ != nullptr) {
      metrics_->RecordRequest(absl::ToDoubleSeconds(absl::Now() - start), rewards);
    }
    if (!rewards.ok()) {
      spdlog::debug("Verify rejected: {}", rewards.status().ToString());
      return services::ToGrpcStatus(rewards.status());
    }
    response->mutable_rewards()->Add(rewards->begin(), rewards->end());
    return grpc::Status::OK;
  } catch (const std::exception& e) {
    spdlog::error("Verify failed: {}", e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

}  // namespace kappa::verifier
