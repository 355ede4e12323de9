#include "rollout_worker/group_sampler.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/stable_hash.h"
#include "base/status.h"
#include "model/sampling.h"
#include "model/token_sampler.h"
#include "model/transformer.h"
#include "rollout_worker/backoff.h"
#include "rollout_worker/response_text.h"
#include "rollout_worker/teacher_demonstrations.h"
#include "services/grpc_util.h"
#include "services/tensor_codec.h"
#include "services/torch_tensor_codec.h"

namespace kappa::rollout {
namespace {

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

constexpr int kMaxGroupSize = 4096;

// How often a retry's backoff checks the caller's abandon(): an opaque
// callback, so it cannot be waited on (Cancel() ends the backoff at once).
constexpr absl::Duration kAbandonCheckInterval = absl::Milliseconds(20);

// A failed RPC as an absl::Status whose message names the RPC.
absl::Status StatusFromGrpc(const char* what, const grpc::Status& grpc_status) {
  const absl::Status status = services::FromGrpcStatus(grpc_status);
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

std::string ShapeString(const kappa::v1::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.shape(), ", "), "]");
}

absl::Status CheckShape(const kappa::v1::Tensor& tensor, const std::string& field,
                        const std::vector<int64_t>& expected) {
  if (absl::Status status = services::ValidateTensor(tensor, field); !status.ok()) return status;
  if (std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end()) != expected) {
    return absl::InternalError(absl::StrCat(field, ": teacher returned shape ",
                                            ShapeString(tensor), ", expected [",
                                            absl::StrJoin(expected, ", "), "]"));
  }
  return absl::OkStatus();
}

// Why `item` cannot be sampled with a model of `config`, or OK.
absl::Status ValidateItem(const kappa::v1::WorkItem& item, const model::ModelConfig& config) {
  if (item.group_size() <= 0 || item.group_size() > kMaxGroupSize) {
    return absl::InvalidArgumentError(absl::StrCat("work item ", item.lease_id(),
                                                   ": group_size ", item.group_size(),
                                                   " outside [1, ", kMaxGroupSize, "]"));
  }
  if (item.prompt_tokens_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("work item ", item.lease_id(), ": empty prompt_tokens"));
  }
  for (int32_t token : item.prompt_tokens()) {
    if (token < 0 || token >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("work item ", item.lease_id(),
                                                     ": prompt token ", token,
                                                     " outside the vocabulary of ",
                                                     config.vocab_size));
    }
  }
  const int form = item.teacher_form();
  if (form < 0 || form > kappa::v1::SCORE_FORM_HIDDEN ||
      (form == kappa::v1::SCORE_FORM_TOPK && item.teacher_top_k() <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("work item ", item.lease_id(),
                                                   ": teacher_form ", form, " with top_k ",
                                                   item.teacher_top_k()));
  }
  const kappa::v1::DType values = item.teacher_value_dtype();
  if (values != kappa::v1::DTYPE_UNSPECIFIED && values != kappa::v1::DTYPE_FLOAT32 &&
      values != kappa::v1::DTYPE_BFLOAT16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "work item ", item.lease_id(), ": teacher_value_dtype ",
        std::string(services::DTypeName(values)), " (use float32 or bfloat16)"));
  }
  if (item.teacher_demonstrations() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("work item ", item.lease_id(),
                                                   ": teacher_demonstrations ",
                                                   item.teacher_demonstrations(), " < 0"));
  }
  if (item.vocab_limit() < 0 || item.vocab_limit() > config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("work item ", item.lease_id(), ": vocab_limit ", item.vocab_limit(),
                     " outside [0, ", config.vocab_size, "] (the policy's vocabulary rows)"));
  }
  for (int32_t id : item.stop_token_ids()) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("work item ", item.lease_id(), ": stop_token_ids entry ", id,
                       " outside the vocabulary of ", config.vocab_size));
    }
  }
  return absl::OkStatus();
}

// The width of the item's distributions: its vocabulary limit, or every row.
int64_t VocabLimitOf(const kappa::v1::WorkItem& item, const model::ModelConfig& config) {
  return item.vocab_limit() > 0 ? item.vocab_limit() : config.vocab_size;
}

// The item's sampling settings, the worker's defaults where it leaves them
// unset, with max_new_tokens cut to what the position table leaves.
absl::StatusOr<model::SamplingParams> SamplingParamsFor(const kappa::v1::WorkItem& item,
                                                        const model::ModelConfig& config,
                                                        const GroupSamplerOptions& options) {
  model::SamplingParams params;
  params.max_new_tokens =
      item.max_new_tokens() > 0 ? item.max_new_tokens() : options.default_max_new_tokens;
  params.max_new_tokens = std::min(params.max_new_tokens,
                                   config.max_position_embeddings - item.prompt_tokens_size());
  if (params.max_new_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "work item ", item.lease_id(), ": prompt of ", item.prompt_tokens_size(),
        " tokens leaves no room in max_position_embeddings ", config.max_position_embeddings));
  }
  params.temperature = item.temperature() > 0 ? item.temperature() : options.default_temperature;
  params.top_p = item.top_p() > 0 && item.top_p() <= 1 ? item.top_p() : options.default_top_p;
  params.top_k = item.top_k() > 0 ? item.top_k() : options.default_top_k;
  params.min_p = item.min_p() > 0 && item.min_p() <= 1 ? item.min_p() : options.default_min_p;
  // The policy that arrives over WatchPolicy is a config.json alone (no
  // directory, no generation_config.json): the learner sends the student's
  // stop ids with every item.
  if (item.stop_token_ids().empty()) {
    params.stop_token_ids = config.eos_token_ids;
  } else {
    params.stop_token_ids.assign(item.stop_token_ids().begin(), item.stop_token_ids().end());
  }
  params.pad_id = config.pad_token_id;
  params.sampleable_vocab_size = VocabLimitOf(item, config);
  return params;
}

// The seed of the item's rows: the learner's, else one from the worker's
// seed and the lease id (unique per lease).
uint64_t ItemSeed(const kappa::v1::WorkItem& item, const GroupSamplerOptions& options) {
  if (item.sampling_seed() != 0) return item.sampling_seed();
  return model::RowSeed(options.seed, static_cast<int64_t>(base::StableHash(item.lease_id())));
}

// The unscored group of `item` from its `count` sampled sequences, each cut
// at the item's first stop string.
absl::StatusOr<kappa::v1::ScoredGroup> GroupOf(const kappa::v1::WorkItem& item,
                                               int64_t policy_version, const std::string& worker_id,
                                               const TokenDecoder& decode,
                                               model::SampledSequence* sequences, size_t count,
                                               double decode_seconds) {
  const std::vector<std::string> stop_strings(item.stop_strings().begin(),
                                              item.stop_strings().end());
  kappa::v1::ScoredGroup group;
  group.set_lease_id(item.lease_id());
  group.set_prompt_id(item.prompt_id());
  *group.mutable_prompt_tokens() = item.prompt_tokens();
  group.set_policy_version(policy_version);
  group.set_worker_id(worker_id);
  group.set_generation_seconds(decode_seconds);
  for (size_t r = 0; r < count; ++r) {
    model::SampledSequence& sequence = sequences[r];
    CutAtStopString(sequence, stop_strings, decode);
    if (sequence.tokens.empty() || sequence.tokens.size() != sequence.logprobs.size()) {
      return absl::InternalError(absl::StrCat("sampling returned ", sequence.tokens.size(),
                                              " tokens with ", sequence.logprobs.size(),
                                              " log-probs"));
    }
    kappa::v1::ScoredSample* sample = group.add_samples();
    for (int64_t token : sequence.tokens) sample->add_response_tokens(static_cast<int32_t>(token));
    const torch::Tensor logprobs =
        torch::from_blob(sequence.logprobs.data(),
                         {static_cast<int64_t>(sequence.logprobs.size())}, torch::kFloat32);
    services::EncodeTensor(logprobs, sample->mutable_behavior_logprobs(),
                           kappa::v1::DTYPE_FLOAT32);
    sample->set_response_text(decode(sequence.tokens));
    sample->set_truncated(sequence.truncated);
  }
  return group;
}

GroupSamplerOptions WithDefaultDecode(GroupSamplerOptions options) {
  if (!options.decode) options.decode = ResponseText;
  return options;
}

}  // namespace

GroupSampler::GroupSampler(std::shared_ptr<grpc::ChannelInterface> verifier_channel,
                           std::shared_ptr<grpc::ChannelInterface> teacher_channel,
                           GroupSamplerOptions options)
    : verifier_(kappa::v1::Verifier::NewStub(std::move(verifier_channel))),
      teacher_(kappa::v1::Teacher::NewStub(std::move(teacher_channel))),
      options_(WithDefaultDecode(std::move(options))),
      deadlines_(options_.rpc_deadline) {}

GroupSampler::~GroupSampler() = default;

void GroupSampler::Cancel() {
  // The release wakes the retries' backoff waits.
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* context : active_contexts_) context->TryCancel();
}

void GroupSampler::Resume() {
  absl::MutexLock lock(&mu_);
  cancelled_ = false;
}

bool GroupSampler::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

absl::StatusOr<model::DecodeRequest> GroupSampler::EngineRequest(const kappa::v1::WorkItem& item,
                                                                 const Policy& policy,
                                                                 uint64_t id) const {
  if (policy.model == nullptr) return absl::FailedPreconditionError("no policy loaded");
  const model::ModelConfig& config = (*policy.model)->config();
  if (absl::Status valid = ValidateItem(item, config); !valid.ok()) return valid;
  absl::StatusOr<model::SamplingParams> params = SamplingParamsFor(item, config, options_);
  if (!params.ok()) return params.status();
  if (LeaseExpired(item)) {
    return absl::DeadlineExceededError(absl::StrCat("lease ", item.lease_id(), " expired"));
  }
  model::DecodeRequest request;
  request.id = id;
  request.model = policy.model;
  request.prompt.assign(item.prompt_tokens().begin(), item.prompt_tokens().end());
  request.num_samples = item.group_size();
  request.max_new_tokens = params->max_new_tokens;
  request.sampling = params->token_sampling();
  request.stop_token_ids = params->stop_token_ids;
  // Rows leave their slots the step a stop string appears; GroupOf's cut
  // still defines where each response ends.
  request.stops_after = StopStringCheck(
      std::vector<std::string>(item.stop_strings().begin(), item.stop_strings().end()),
      options_.decode);
  request.seed = ItemSeed(item, options_);
  return request;
}

absl::StatusOr<kappa::v1::ScoredGroup> GroupSampler::GroupFromEngine(
    const kappa::v1::WorkItem& item, int64_t policy_version,
    std::vector<model::SampledSequence> samples, double seconds) const {
  if (static_cast<int64_t>(samples.size()) != item.group_size()) {
    return absl::InternalError(absl::StrCat("the engine returned ", samples.size(),
                                            " samples for a group of ", item.group_size()));
  }
  return GroupOf(item, policy_version, options_.worker_id, options_.decode, samples.data(),
                 samples.size(), seconds);
}

absl::StatusOr<kappa::v1::ScoredGroup> GroupSampler::Complete(
    const kappa::v1::WorkItem& item, kappa::v1::ScoredGroup group, const Policy& policy,
    const std::function<bool()>& abandon) {
  if (policy.model == nullptr) return absl::FailedPreconditionError("no policy loaded");
  const model::ModelConfig& config = (*policy.model)->config();
  absl::StatusOr<model::SamplingParams> params = SamplingParamsFor(item, config, options_);
  if (!params.ok()) return params.status();

  const int64_t vocab_limit = VocabLimitOf(item, config);
  StageTimes times;
  times.decode = group.generation_seconds();
  absl::Time start = absl::Now();
  if (absl::Status status = Verify(item, group, abandon); !status.ok()) return status;
  times.verify = SecondsSince(start);
  if (item.teacher_form() != 0) {
    start = absl::Now();
    if (absl::Status status = Score(item, vocab_limit, group, abandon); !status.ok()) {
      return status;
    }
    times.teacher_score = SecondsSince(start);
  }
  if (WantsDemonstrations(item, group)) {
    start = absl::Now();
    if (absl::Status status =
            AddDemonstrations(item, params->max_new_tokens, vocab_limit, group, abandon);
        !status.ok()) {
      return status;
    }
    times.demonstrations = SecondsSince(start);
  }
  group.set_generation_seconds(times.Total());
  RecordStageTimes(item, times);
  return group;
}

void GroupSampler::RecordStageTimes(const kappa::v1::WorkItem& item, const StageTimes& times) {
  if (options_.metrics != nullptr) {
    options_.metrics->RecordStageSeconds("decode", times.decode);
    options_.metrics->RecordStageSeconds("verify", times.verify);
    if (item.teacher_form() != 0) {
      options_.metrics->RecordStageSeconds("teacher_score", times.teacher_score);
    }
    if (times.demonstrations > 0) {
      options_.metrics->RecordStageSeconds("demonstrations", times.demonstrations);
    }
  }
  spdlog::info(
      "group stages: prompt {} decode {:.3f}s verify {:.3f}s teacher_score {:.3f}s "
      "demonstrations {:.3f}s",
      item.prompt_id(), times.decode, times.verify, times.teacher_score, times.demonstrations);
}

void GroupSampler::RecordBytes(const char* message, int64_t sent, int64_t received) {
  if (options_.metrics != nullptr) {
    options_.metrics->RecordMessageBytes(message, "sent", sent);
    options_.metrics->RecordMessageBytes(message, "received", received);
  }
  absl::MutexLock lock(&mu_);
  const bool score = std::string_view(message) == "score";
  (score ? message_bytes_.score_calls : message_bytes_.verify_calls) += 1;
  (score ? message_bytes_.score_sent : message_bytes_.verify_sent) += sent;
  (score ? message_bytes_.score_received : message_bytes_.verify_received) += received;
}

SamplerMessageBytes GroupSampler::message_bytes() const {
  absl::MutexLock lock(&mu_);
  return message_bytes_;
}

bool GroupSampler::LeaseExpired(const kappa::v1::WorkItem& item) const {
  if (options_.leases != nullptr) return options_.leases->Expired(item);
  return item.lease_deadline_unix_ms() > 0 &&
         absl::ToUnixMillis(absl::Now()) > item.lease_deadline_unix_ms();
}

absl::Status GroupSampler::CallWithRetry(
    const char* what, const kappa::v1::WorkItem& item, const std::function<bool()>& abandon,
    const std::function<grpc::Status(grpc::ClientContext*)>& call, double units, int max_attempts) {
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  auto should_stop = [&] { return cancelled() || (abandon && abandon()); };
  int timeouts = 0;  // attempts of this call that ran out of time
  for (int attempt = 1;; ++attempt) {
    if (should_stop()) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
    if (LeaseExpired(item)) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": lease ", item.lease_id(), " expired after ", attempt - 1,
                       " attempts"));
    }
    grpc::ClientContext context;
    const absl::Time start = absl::Now();
    context.set_deadline(absl::ToChronoTime(start + deadlines_.For(what, units, timeouts)));
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
      active_contexts_.insert(&context);
    }
    const grpc::Status status = call(&context);
    {
      absl::MutexLock lock(&mu_);
      active_contexts_.erase(&context);
    }
    if (status.ok()) {
      deadlines_.Record(what, units, absl::Now() - start);
      return absl::OkStatus();
    }
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++timeouts;
    if (options_.metrics != nullptr && !should_stop()) {
      options_.metrics->RecordRpcError(PeerOfRpc(what));
    }
    if (!IsRetryableGrpcCode(status.error_code())) return StatusFromGrpc(what, status);
    if (max_attempts > 0 && attempt >= max_attempts) {
      const absl::Status last = StatusFromGrpc(what, status);
      return absl::Status(last.code(),
                          absl::StrCat(last.message(), " (gave up after ", attempt, " attempts)"));
    }
    const absl::Duration delay = backoff.Next();
    spdlog::warn("{} for lease {} failed (attempt {}, code {}: {}); retrying in {:.0f} ms", what,
                 item.lease_id(), attempt, static_cast<int>(status.error_code()),
                 status.error_message(), absl::ToDoubleMilliseconds(delay));
    // Wait out the backoff: Cancel() ends the wait at once, abandon() is
    // checked between slices.
    const absl::Time wake = absl::Now() + delay;
    while (!should_stop()) {
      const absl::Time now = absl::Now();
      if (now >= wake) break;
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&cancelled_),
                            std::min(wake, now + kAbandonCheckInterval));
    }
  }
}

absl::Status GroupSampler::Verify(const kappa::v1::WorkItem& item, kappa::v1::ScoredGroup& group,
                                  const std::function<bool()>& abandon) {
  kappa::v1::VerifyRequest request;
  for (const kappa::v1::ScoredSample& sample : group.samples()) {
    kappa::v1::VerifyItem* verify_item = request.add_items();
    verify_item->set_task(item.task());
    verify_item->set_reference_answer(item.reference_answer());
    // The verifier runs a code task's tests from its own --code-tasks file
    // by this id (verifier.proto).
    verify_item->set_example_id(item.prompt_id());
    verify_item->set_response_text(sample.response_text());
  }
  kappa::v1::VerifyResponse response;
  absl::Status status = CallWithRetry(
      "Verifier.Verify", item, abandon,
      [&](grpc::ClientContext* context) {
        response.Clear();
        return verifier_->Verify(context, request, &response);
      },
      static_cast<double>(request.items_size()));
  if (!status.ok()) return status;
  RecordBytes("verify", static_cast<int64_t>(request.ByteSizeLong()),
              static_cast<int64_t>(response.ByteSizeLong()));
  if (response.rewards_size() != group.samples_size()) {
    return absl::InternalError(absl::StrCat("Verifier.Verify returned ", response.rewards_size(),
                                            " rewards for ", group.samples_size(), " items"));
  }
  for (int i = 0; i < response.rewards_size(); ++i) {
    if (!std::isfinite(response.rewards(i))) {
      return absl::InternalError(absl::StrCat("Verifier.Verify: rewards[", i, "] is not finite"));
    }
    group.mutable_samples(i)->set_reward(response.rewards(i));
  }
  return absl::OkStatus();
}

absl::Status GroupSampler::Score(const kappa::v1::WorkItem& item, int64_t vocab_size,
                                 kappa::v1::ScoredGroup& group,
                                 const std::function<bool()>& abandon) {
  const auto form = static_cast<kappa::v1::ScoreForm>(item.teacher_form());
  kappa::v1::ScoreRequest request;
  request.set_form(form);
  // The teacher refuses top_k > V; a k past the vocabulary means all of it,
  // which is what the shape check below and the learner expect.
  request.set_top_k(form == kappa::v1::SCORE_FORM_TOPK
                        ? static_cast<int32_t>(std::min<int64_t>(item.teacher_top_k(), vocab_size))
                        : item.teacher_top_k());
  request.set_value_dtype(item.teacher_value_dtype() == kappa::v1::DTYPE_BFLOAT16
                              ? kappa::v1::DTYPE_BFLOAT16
                              : kappa::v1::DTYPE_FLOAT32);
  request.set_vocab_size(static_cast<int32_t>(vocab_size));
  for (const kappa::v1::ScoredSample& sample : group.samples()) {
    kappa::v1::ScoreSequence* sequence = request.add_sequences();
    *sequence->mutable_prompt_tokens() = group.prompt_tokens();
    *sequence->mutable_response_tokens() = sample.response_tokens();
  }
  kappa::v1::ScoreResponse response;
  int64_t positions = 0;
  for (const kappa::v1::ScoreSequence& sequence : request.sequences()) {
    positions += sequence.prompt_tokens_size() + sequence.response_tokens_size();
  }
  absl::Status status = CallWithRetry(
      "Teacher.Score", item, abandon,
      [&](grpc::ClientContext* context) {
        response.Clear();
        return teacher_->Score(context, request, &response);
      },
      static_cast<double>(positions));
  if (!status.ok()) return status;
  RecordBytes("score", static_cast<int64_t>(request.ByteSizeLong()),
              static_cast<int64_t>(response.ByteSizeLong()));
  if (response.sequences_size() != group.samples_size()) {
    return absl::InternalError(absl::StrCat("Teacher.Score returned ", response.sequences_size(),
                                            " sequences for ", group.samples_size()));
  }
  for (int i = 0; i < response.sequences_size(); ++i) {
    kappa::v1::ScoredSequence& scored = *response.mutable_sequences(i);
    kappa::v1::ScoredSample& sample = *group.mutable_samples(i);
    const int64_t length = sample.response_tokens_size();
    const std::string field = absl::StrCat("Teacher.Score sequences[", i, "]");
    absl::Status shape_status;
    switch (form) {
      case kappa::v1::SCORE_FORM_UNSPECIFIED:
      case kappa::v1::SCORE_FORM_FULL:
        shape_status = CheckShape(scored.logprobs(), field + ".logprobs", {length, vocab_size});
        break;
      case kappa::v1::SCORE_FORM_SAMPLED:
        shape_status = CheckShape(scored.logprobs(), field + ".logprobs", {length});
        break;
      case kappa::v1::SCORE_FORM_TOPK: {
        const int64_t k = std::min<int64_t>(item.teacher_top_k(), vocab_size);
        shape_status = CheckShape(scored.logprobs(), field + ".logprobs", {length, k});
        if (shape_status.ok()) {
          shape_status = CheckShape(scored.topk_ids(), field + ".topk_ids", {length, k});
        }
        if (shape_status.ok() && !scored.has_tail_logmass()) {
          shape_status = absl::InternalError(
              absl::StrCat(field,
                           ".tail_logmass: missing (a teacher that predates the "
                           "float32 tail mass of the TOPK form)"));
        }
        if (shape_status.ok()) {
          shape_status = CheckShape(scored.tail_logmass(), field + ".tail_logmass", {length});
        }
        break;
      }
      case kappa::v1::SCORE_FORM_HIDDEN: {
        // [T, D_t]: the width is the teacher's; the learner checks it
        // against the head it holds.
        const int64_t width = scored.hidden().shape_size() == 2 ? scored.hidden().shape(1) : -1;
        shape_status = CheckShape(scored.hidden(), field + ".hidden", {length, width});
        break;
      }
      default:
        shape_status = absl::InvalidArgumentError(absl::StrCat("unknown teacher form ", form));
    }
    if (!shape_status.ok()) return shape_status;
    if (form == kappa::v1::SCORE_FORM_HIDDEN) {
      *sample.mutable_teacher_hidden() = std::move(*scored.mutable_hidden());
      continue;
    }
    *sample.mutable_teacher_logprobs() = std::move(*scored.mutable_logprobs());
    if (form == kappa::v1::SCORE_FORM_TOPK) {
      *sample.mutable_teacher_topk_ids() = std::move(*scored.mutable_topk_ids());
      *sample.mutable_teacher_tail_logmass() = std::move(*scored.mutable_tail_logmass());
    }
  }
  return absl::OkStatus();
}

absl::Status GroupSampler::AddDemonstrations(const kappa::v1::WorkItem& item,
                                             int64_t max_new_tokens, int64_t vocab_size,
                                             kappa::v1::ScoredGroup& group,
                                             const std::function<bool()>& abandon) {
  DemonstrationParams params;
  params.num_samples = item.teacher_demonstrations();
  params.max_new_tokens = max_new_tokens;
  params.vocab_size = vocab_size;
  params.temperature = item.teacher_temperature();
  params.seed = DemonstrationSeed(options_.seed, item.lease_id());
  params.decode = options_.decode;
  const RpcRunner run = [&](const char* what,
                            const std::function<grpc::Status(grpc::ClientContext*)>& call) {
    return CallWithRetry(what, item, abandon, call, /*units=*/1.0, options_.demonstration_attempts);
  };
  absl::StatusOr<std::vector<kappa::v1::TeacherDemonstration>> demonstrations =
      FetchDemonstrations(item, params, *teacher_, *verifier_, run);
  if (!demonstrations.ok()) {
    // Cancelled: the worker is stopping or the stream broke, so the group
    // itself is being abandoned.
    if (absl::IsCancelled(demonstrations.status())) return demonstrations.status();
    spdlog::warn("lease {} (prompt {}): sending the group without teacher demonstrations: {}",
                 item.lease_id(), item.prompt_id(), demonstrations.status().ToString());
    return absl::OkStatus();
  }
  for (kappa::v1::TeacherDemonstration& demonstration : *demonstrations) {
    *group.add_demonstrations() = std::move(demonstration);
  }
  return absl::OkStatus();
}

}  // namespace kappa::rollout
