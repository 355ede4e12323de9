#include "verifier/verifier_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "base/utf8.h"
#include "services/call_state.h"
#include "services/grpc_util.h"
#include "tasks/answer.h"

namespace kappa::verifier {
namespace {

absl::Status FieldError(int index, const char* field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("items[", index, "].", field, ": ", message));
}

// The item's task family: the verifier's override, else its own task field.
std::string_view FamilyOf(const kappa::v1::VerifyItem& item, const VerifierOptions& options) {
  return options.reward_family.has_value() ? std::string_view(*options.reward_family)
                                           : std::string_view(item.task());
}

// What chose an item's family, for messages: "items[3].task" or the key.
std::string FamilySource(int index, const VerifierOptions& options) {
  return options.reward_family.has_value() ? std::string("verifier.reward")
                                           : absl::StrCat("items[", index, "].task");
}

// The tests a code item runs: the loaded file's for its example_id, else its
// own reference_answer, from an authenticated caller only.
absl::StatusOr<std::string_view> TestsOf(const kappa::v1::VerifyItem& item, int index,
                                         const VerifierOptions& options) {
  const std::string& id = item.example_id();
  const std::string* loaded =
      options.code_tasks != nullptr && !id.empty() ? options.code_tasks->TestsOf(id) : nullptr;
  if (loaded != nullptr) {
    if (!item.reference_answer().empty() && item.reference_answer() != *loaded) {
      return FieldError(index, "reference_answer",
                        absl::StrCat("differs from the tests of example '", id,
                                     "' in --code-tasks: send them unchanged or leave it empty"));
    }
    return std::string_view(*loaded);
  }
  if (options.callers_authenticated) return std::string_view(item.reference_answer());
  const std::string why = id.empty() ? std::string("the item has no example_id")
                          : options.code_tasks == nullptr
                              ? "this verifier has no --code-tasks file"
                              : absl::StrCat("example '", id, "' is not in --code-tasks");
  return absl::PermissionDeniedError(absl::StrCat(
      "items[", index,
      "].reference_answer: this verifier runs only the tests of its "
      "--code-tasks file for callers it does not authenticate (",
      why,
      "); send the example_id of a loaded code task, or serve with security.mutual_tls or "
      "tokens so callers may send their own tests"));
}

absl::Status ValidateCodeItem(const kappa::v1::VerifyItem& item, int index,
                              const VerifierOptions& options, const CodeRewarder* code) {
  if (code == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        FamilySource(index, options),
        ": code tasks are disabled on this verifier (start kappa-verifier with --enable-code)"));
  }
  if (!code->available().ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(FamilySource(index, options), ": ", code->available().message()));
  }
  if (!base::IsValidUtf8(item.example_id())) {
    return FieldError(index, "example_id", "not valid UTF-8");
  }
  if (!base::IsValidUtf8(item.reference_answer())) {
    return FieldError(index, "reference_answer", "not valid UTF-8");
  }
  absl::StatusOr<std::string_view> tests = TestsOf(item, index, options);
  if (!tests.ok()) return tests.status();
  if (absl::Status status = code->ValidateTests(*tests); !status.ok()) {
    return FieldError(index, "reference_answer", status.message());
  }
  if (!base::IsValidUtf8(item.response_text())) {
    return FieldError(index, "response_text", "not valid UTF-8");
  }
  if (absl::Status status = code->ValidateResponse(item.response_text()); !status.ok()) {
    return FieldError(index, "response_text", status.message());
  }
  return absl::OkStatus();
}

absl::Status ValidateItem(const kappa::v1::VerifyItem& item, int index,
                          const VerifierOptions& options, const CodeRewarder* code) {
  // The text fields are bytes on the wire (verifier.proto): UTF-8 is checked
  // here, so the caller learns which field of which item is wrong. Under
  // verifier.reward the task field is not read, so not checked either.
  if (!options.reward_family.has_value() && !base::IsValidUtf8(item.task())) {
    return FieldError(index, "task", "not valid UTF-8");
  }
  const std::string_view family = FamilyOf(item, options);
  if (tasks::IsCodeTask(family)) return ValidateCodeItem(item, index, options, code);
  if (absl::Status status = tasks::ValidateTask(family); !status.ok()) {
    return FieldError(index, "task", status.message());
  }
  if (!base::IsValidUtf8(item.reference_answer())) {
    return FieldError(index, "reference_answer", "not valid UTF-8");
  }
  if (absl::Status status = tasks::ValidateReference(family, item.reference_answer());
      !status.ok()) {
    return FieldError(index, "reference_answer", status.message());
  }
  if (!base::IsValidUtf8(item.response_text())) {
    return FieldError(index, "response_text", "not valid UTF-8");
  }
  return absl::OkStatus();
}

// Runs the request's code items (indices `code_items`), up to
// code.capacity() at once; the slots bound the sandboxes across all calls.
// The items were validated, so TestsOf succeeds for each.
absl::Status ScoreCodeItems(const kappa::v1::VerifyRequest& request,
                            const std::vector<int>& code_items, const VerifierOptions& options,
                            CodeRewarder& code, const std::function<absl::Status()>& stop,
                            std::vector<float>* rewards) {
  std::atomic<size_t> next{0};
  absl::Mutex stopped_mu;
  absl::Status stopped;
  auto work = [&] {
    for (size_t k = next++; k < code_items.size(); k = next++) {
      if (stop) {
        if (absl::Status why = stop(); !why.ok()) {
          absl::MutexLock lock(&stopped_mu);
          if (stopped.ok()) stopped = why;
          next = code_items.size();  // no further item starts
          return;
        }
      }
      const int index = code_items[k];
      const kappa::v1::VerifyItem& item = request.items(index);
      const absl::StatusOr<std::string_view> tests = TestsOf(item, index, options);
      (*rewards)[index] = tests.ok() ? code.Run(*tests, item.response_text()).reward() : 0.0f;
    }
  };
  const size_t threads = std::min(code_items.size(), static_cast<size_t>(code.capacity()));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
  absl::MutexLock lock(&stopped_mu);
  return stopped;
}

// RESOURCE_EXHAUSTED when `code_items` runs could take longer, together,
// than the per-request budget allows.
absl::Status WithinSandboxBudget(size_t code_items, const CodeOptions& code) {
  const double wall = absl::ToDoubleSeconds(code.sandbox.wall_timeout);
  const double cost = static_cast<double>(code_items) * wall;
  if (cost <= static_cast<double>(code.max_request_sandbox_seconds)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "items: ", code_items, " code items x ", wall, " s wall timeout = ", cost,
      " sandbox-seconds exceed the per-request budget of ", code.max_request_sandbox_seconds,
      " (--code-request-seconds); split the request"));
}

}  // namespace

absl::Status ApplyVerifierConfig(const services::Config& config, VerifierOptions* options) {
  options->max_items = config.verifier.max_items;
  absl::StatusOr<std::optional<std::string_view>> family =
      tasks::RewardFamily(config.verifier.reward);
  if (!family.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("verifier.reward: ", family.status().message()));
  }
  if (family->has_value() && tasks::IsCodeTask(**family) && !options->code.enabled) {
    return absl::InvalidArgumentError(
        "verifier.reward: 'code' runs model-written code in the sandbox, which is off; pass "
        "--enable-code to kappa-verifier (see docs/security.md)");
  }
  options->reward_family =
      family->has_value() ? std::optional<std::string>(**family) : std::nullopt;
  return absl::OkStatus();
}

VerifierService::VerifierService(VerifierOptions options, VerifierMetrics* metrics)
    : options_(options), metrics_(metrics) {
  if (options_.code.enabled) code_ = std::make_unique<CodeRewarder>(options_.code, metrics_);
}

absl::Status VerifierService::CodeStatus() const {
  return code_ == nullptr ? absl::OkStatus() : code_->available();
}

absl::StatusOr<std::vector<float>> ScoreRequest(const kappa::v1::VerifyRequest& request,
                                                const VerifierOptions& options, CodeRewarder* code,
                                                const std::function<absl::Status()>& stop) {
  if (request.items_size() == 0) return absl::InvalidArgumentError("items: empty request");
  if (request.items_size() > options.max_items) {
    return absl::InvalidArgumentError(absl::StrCat("items: ", request.items_size(),
                                                   " items exceed the limit of ",
                                                   options.max_items, " per request"));
  }
  // Validate everything first: a malformed item fails the whole request.
  for (int i = 0; i < request.items_size(); ++i) {
    if (absl::Status status = ValidateItem(request.items(i), i, options, code); !status.ok()) {
      return status;
    }
  }
  std::vector<float> rewards(request.items_size(), 0.0f);
  std::vector<int> code_items;
  for (int i = 0; i < request.items_size(); ++i) {
    const kappa::v1::VerifyItem& item = request.items(i);
    const std::string_view family = FamilyOf(item, options);
    if (tasks::IsCodeTask(family)) {
      code_items.push_back(i);
      continue;
    }
    absl::StatusOr<float> reward =
        tasks::ExactAnswerReward(family, item.reference_answer(), item.response_text());
    if (!reward.ok()) return FieldError(i, "reference_answer", reward.status().message());
    rewards[i] = *reward;
  }
  if (!code_items.empty()) {
    KAPPA_RETURN_IF_ERROR(WithinSandboxBudget(code_items.size(), options.code));
    KAPPA_RETURN_IF_ERROR(ScoreCodeItems(request, code_items, options, *code, stop, &rewards));
  }
  return rewards;
}

grpc::Status VerifierService::Verify(grpc::ServerContext* context,
                                     const kappa::v1::VerifyRequest* request,
                                     kappa::v1::VerifyResponse* response) {
  // No sandbox starts for a caller that went away or whose deadline passed.
  const absl::Time deadline = services::CallDeadline(*context, absl::InfiniteFuture());
  const std::function<absl::Status()> stop = [context, deadline] {
    return services::CallStillWanted(*context, deadline, "Verify");
  };
  absl::StatusOr<grpc::Status> handled = base::CaptureExceptions("", [&] {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<float>> rewards =
        ScoreRequest(*request, options_, code_.get(), stop);
    if (metrics_ != nullptr) {
      metrics_->RecordRequest(absl::ToDoubleSeconds(absl::Now() - start), rewards);
    }
    if (!rewards.ok()) {
      spdlog::debug("Verify rejected: {}", rewards.status().ToString());
      return services::ToGrpcStatus(rewards.status());
    }
    response->mutable_rewards()->Add(rewards->begin(), rewards->end());
    return grpc::Status::OK;
  });
  if (handled.ok()) return *handled;
  // INTERNAL whatever was thrown (a sandbox's system error, bad_alloc): the
  // request was validated, so it is the verifier's failure, not the caller's.
  spdlog::error("Verify failed: {}", std::string(handled.status().message()));
  return grpc::Status(grpc::StatusCode::INTERNAL, std::string(handled.status().message()));
}

}  // namespace kappa::verifier
