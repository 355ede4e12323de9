#include "teacher_server/teacher_service.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "model/generation_config.h"
#include "model/sampling.h"
#include "services/call_state.h"
#include "services/grpc_util.h"
#include "services/tensor_codec.h"
#include "services/torch_tensor_codec.h"
#include "teacher_server/scorer.h"

namespace kappa::teacher {
namespace {

using kappa::v1::DType;

// One Score request's share of a batch (a request larger than a batch is
// split into several units). The batch function fills `logprobs`.
class ScoreUnit final : public BatchUnit {
 public:
  int64_t num_sequences() const override { return static_cast<int64_t>(sequences.size()); }

  std::vector<TokenSequence> sequences;
  bool hidden = false;  // SCORE_FORM_HIDDEN: fill `rows` with hidden states, not log-probs
  std::vector<torch::Tensor> rows;  // [T_i, V] log-probs, or [T_i, D] hidden states (float32, CPU)
};

absl::StatusOr<ScoreForm> ToScoreForm(kappa::v1::ScoreForm form) {
  switch (form) {
    case kappa::v1::SCORE_FORM_UNSPECIFIED:
    case kappa::v1::SCORE_FORM_FULL:
      return ScoreForm::kFull;
    case kappa::v1::SCORE_FORM_TOPK:
      return ScoreForm::kTopK;
    case kappa::v1::SCORE_FORM_SAMPLED:
      return ScoreForm::kSampled;
    case kappa::v1::SCORE_FORM_HIDDEN:
      return ScoreForm::kHidden;
    default:
      return absl::InvalidArgumentError(absl::StrCat("form: unknown value ", static_cast<int>(form)));
  }
}

// The wire dtype of returned values: FLOAT32 unless BFLOAT16 was asked for.
DType ValueDType(DType requested) {
  return requested == kappa::v1::DTYPE_BFLOAT16 ? kappa::v1::DTYPE_BFLOAT16
                                                 : kappa::v1::DTYPE_FLOAT32;
}

template <typename Ids>
absl::Status ValidateTokenIds(const Ids& ids, const std::string& field, int64_t vocab_size) {
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: token id ", ids[i],
                                                     " out of range [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// Runs `fn` (returning absl::Status) so that no exception of the model code
// escapes the handler: it comes back INTERNAL, since every request was
// validated before the model saw it. (A throw of no std::exception reaches
// gRPC's own handler wrapper: UNKNOWN.)
template <typename Fn>
grpc::Status Guarded(const char* rpc, Fn&& fn) {
  absl::Status status;
  const absl::Status thrown = base::CaptureExceptions("", [&] {
    try {
      status = fn();
    } catch (const c10::Error& e) {  // its what() carries a C++ backtrace: not for clients
      throw std::runtime_error(e.what_without_backtrace());
    }
  });
  if (!thrown.ok()) {
    spdlog::error("Teacher.{}: {}", rpc, std::string(thrown.message()));
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("teacher ", rpc, ": ", thrown.message()));
  }
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) {
    spdlog::warn("Teacher.{}: {}", rpc, status.ToString());
  }
  return services::ToGrpcStatus(status);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TeacherService>> TeacherService::Create(
    model::Decoder model, const TeacherOptions& options, TeacherMetrics* metrics) {
  if (model.is_empty()) return absl::InvalidArgumentError("model: empty");
  if (options.max_request_sequences <= 0) {
    return absl::InvalidArgumentError("max_request_sequences: must be > 0");
  }
  if (options.max_generate_samples <= 0) {
    return absl::InvalidArgumentError("max_generate_samples: must be > 0");
  }
  if (options.max_new_tokens < 0) return absl::InvalidArgumentError("max_new_tokens: must be >= 0");
  if (options.max_request_positions <= 0) {
    return absl::InvalidArgumentError("teacher.max_request_positions: must be > 0");
  }
  if (options.default_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_deadline: must be > 0");
  }
  if (options.vocab_limit < 0 || options.vocab_limit > model->config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_limit: ", options.vocab_limit,
                                                   " outside [0, ", model->config().vocab_size,
                                                   "] (the model's vocabulary rows)"));
  }
  KAPPA_ASSIGN_OR_RETURN(std::vector<int64_t> stop_token_ids,
                         base::CaptureExceptions(
                             "stop ids", [&] { return model::StopTokenIds(model->config()); },
                             absl::StatusCode::kInvalidArgument));
  std::unique_ptr<TeacherService> service(
      new TeacherService(std::move(model), options, metrics, std::move(stop_token_ids)));
  absl::StatusOr<std::unique_ptr<DynamicBatcher>> batcher = DynamicBatcher::Create(
      options.batching,
      [raw = service.get()](const std::vector<BatchUnit*>& units) { return raw->RunScoreBatch(units); });
  if (!batcher.ok()) return batcher.status();
  service->batcher_ = std::move(*batcher);
  return service;
}

TeacherService::TeacherService(model::Decoder model, const TeacherOptions& options,
                               TeacherMetrics* metrics, std::vector<int64_t> stop_token_ids)
    : options_(options),
      metrics_(metrics),
      vocab_size_(model->config().vocab_size),
      vocab_limit_(options.vocab_limit > 0 ? options.vocab_limit : model->config().vocab_size),
      max_positions_(model->config().max_position_embeddings),
      hidden_size_(model->config().hidden_size),
      stop_token_ids_(std::move(stop_token_ids)),
      max_new_tokens_(options.max_new_tokens > 0 ? std::min(options.max_new_tokens,
                                                            model->config().max_position_embeddings)
                                                 : model->config().max_position_embeddings),
      model_(std::move(model)) {
  model_->eval();
}

TeacherService::~TeacherService() { Shutdown(); }

void TeacherService::Shutdown() {
  if (batcher_ != nullptr) batcher_->Shutdown();
}

absl::Time TeacherService::DeadlineOf(const grpc::ServerContext* context) const {
  return services::CallDeadline(*context, absl::Now() + options_.default_deadline);
}

// ---------------------------------------------------------------- Score

absl::Status TeacherService::ValidateScoreRequest(const kappa::v1::ScoreRequest& request) const {
  if (request.vocab_size() != vocab_limit_) {
    if (request.vocab_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vocab_size: required (the student's vocabulary size); teacher has ", vocab_limit_));
    }
    return absl::InvalidArgumentError(absl::StrCat("vocab_size: student has ", request.vocab_size(),
                                                   ", teacher has ", vocab_limit_));
  }
  absl::StatusOr<ScoreForm> form = ToScoreForm(request.form());
  if (!form.ok()) return form.status();
  if (*form == ScoreForm::kTopK && (request.top_k() <= 0 || request.top_k() > vocab_limit_)) {
    return absl::InvalidArgumentError(absl::StrCat("top_k: must be in [1, ", vocab_limit_,
                                                   "] for SCORE_FORM_TOPK, got ", request.top_k()));
  }
  const DType dtype = request.value_dtype();
  if (dtype != kappa::v1::DTYPE_UNSPECIFIED && dtype != kappa::v1::DTYPE_FLOAT32 &&
      dtype != kappa::v1::DTYPE_BFLOAT16) {
    std::string name(services::DTypeName(dtype));
    if (name.empty()) name = absl::StrCat(static_cast<int>(dtype));
    return absl::InvalidArgumentError(
        absl::StrCat("value_dtype: ", name, " unsupported; use DTYPE_FLOAT32 or DTYPE_BFLOAT16"));
  }
  if (request.sequences().empty()) return absl::InvalidArgumentError("sequences: empty");
  if (request.sequences_size() > options_.max_request_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("sequences: ", request.sequences_size(),
                                                   " exceed the limit of ",
                                                   options_.max_request_sequences, " per request"));
  }
  int64_t positions = 0;
  for (int i = 0; i < request.sequences_size(); ++i) {
    const kappa::v1::ScoreSequence& s = request.sequences(i);
    const std::string field = absl::StrCat("sequences[", i, "]");
    if (absl::Status st = ValidateTokenIds(s.prompt_tokens(), field + ".prompt_tokens", vocab_size_);
        !st.ok()) {
      return st;
    }
    // A response id names a token, so it lies below the limit; a prompt
    // may hold any row.
    if (absl::Status st =
            ValidateTokenIds(s.response_tokens(), field + ".response_tokens", vocab_limit_);
        !st.ok()) {
      return st;
    }
    const int64_t total = static_cast<int64_t>(s.prompt_tokens_size()) + s.response_tokens_size();
    if (total > max_positions_) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", total, " tokens (prompt ", s.prompt_tokens_size(), " + response ",
          s.response_tokens_size(), ") exceed max_position_embeddings ", max_positions_));
    }
    positions += total;
  }
  return WithinBudget("sequences", positions);
}

absl::Status TeacherService::WithinBudget(const char* field, int64_t positions) const {
  if (positions <= options_.max_request_positions) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      field, ": ", positions, " token positions exceed the per-request budget of ",
      options_.max_request_positions, " (teacher.max_request_positions); split the request"));
}

grpc::Status TeacherService::Score(grpc::ServerContext* context,
                                   const kappa::v1::ScoreRequest* request,
                                   kappa::v1::ScoreResponse* response) {
  const absl::Time start = absl::Now();
  const grpc::Status status =
      Guarded("Score", [&] { return ScoreImpl(*request, *context, response); });
  int64_t positions = 0;
  for (const kappa::v1::ScoreSequence& s : request->sequences()) positions += s.response_tokens_size();
  Record("score", start, status, positions);
  return status;
}

void TeacherService::Record(const char* method, absl::Time start, const grpc::Status& status,
                            int64_t positions) const {
  if (metrics_ == nullptr) return;
  metrics_->RecordRequest(method, absl::ToDoubleSeconds(absl::Now() - start), status.ok(),
                          positions);
}

absl::Status TeacherService::ScoreImpl(const kappa::v1::ScoreRequest& request,
                                       const grpc::ServerContext& context,
                                       kappa::v1::ScoreResponse* response) {
  if (absl::Status st = ValidateScoreRequest(request); !st.ok()) return st;
  const absl::Time deadline = DeadlineOf(&context);
  const std::function<bool()> cancelled = [&context] { return context.IsCancelled(); };
  const ScoreForm form = *ToScoreForm(request.form());
  const DType wire_dtype = ValueDType(request.value_dtype());
  const int64_t unit_size = batcher_->options().max_batch_sequences;

  response->set_vocab_size(static_cast<int32_t>(vocab_limit_));
  for (int begin = 0; begin < request.sequences_size(); begin += unit_size) {
    const int end = static_cast<int>(std::min<int64_t>(request.sequences_size(), begin + unit_size));
    auto unit = std::make_shared<ScoreUnit>();
    unit->hidden = form == ScoreForm::kHidden;
    unit->sequences.reserve(end - begin);
    for (int i = begin; i < end; ++i) {
      const kappa::v1::ScoreSequence& s = request.sequences(i);
      unit->sequences.push_back(
          TokenSequence{{s.prompt_tokens().begin(), s.prompt_tokens().end()},
                        {s.response_tokens().begin(), s.response_tokens().end()}});
    }
    if (absl::Status st = batcher_->Submit(unit, deadline, cancelled); !st.ok()) return st;

    // Reducing to the requested form and encoding happen here, on the handler
    // thread, so the batching thread only runs forwards.
    for (size_t i = 0; i < unit->sequences.size(); ++i) {
      if (unit->hidden) {
        const std::string field = absl::StrCat("sequences[", begin + i, "].hidden");
        if (absl::Status finite = CheckFiniteHidden(unit->rows[i], field); !finite.ok()) {
          if (metrics_ != nullptr) metrics_->RecordNonFiniteScore();
          return finite;
        }
        services::EncodeTensor(unit->rows[i], response->add_sequences()->mutable_hidden(),
                               wire_dtype);
        continue;
      }
      ScoredTensors scored =
          SelectForm(unit->rows[i], unit->sequences[i].response_tokens, form, request.top_k());
      const std::string field = absl::StrCat("sequences[", begin + i, "].logprobs");
      if (absl::Status finite = CheckFiniteLogProbs(scored.logprobs, field); !finite.ok()) {
        if (metrics_ != nullptr) metrics_->RecordNonFiniteScore();
        return finite;
      }
      kappa::v1::ScoredSequence* out = response->add_sequences();
      services::EncodeTensor(scored.logprobs, out->mutable_logprobs(), wire_dtype);
      if (scored.topk_ids.defined()) {
        services::EncodeTensor(scored.topk_ids, out->mutable_topk_ids(), kappa::v1::DTYPE_INT32);
      }
      if (scored.tail_logmass.defined()) {  // float32 whatever the values' wire dtype
        services::EncodeTensor(scored.tail_logmass, out->mutable_tail_logmass(),
                               kappa::v1::DTYPE_FLOAT32);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TeacherService::RunScoreBatch(const std::vector<BatchUnit*>& units) {
  std::vector<const TokenSequence*> sequences;
  for (BatchUnit* unit : units) {
    for (const TokenSequence& s : static_cast<ScoreUnit*>(unit)->sequences) sequences.push_back(&s);
  }
  // One forward for every unit; then each unit's rows as it asked for them:
  // the hidden states themselves, or log-probs through the head.
  std::vector<torch::Tensor> rows;
  const absl::Time start = absl::Now();
  {
    absl::MutexLock lock(&model_mu_);
    const ResponseHiddenRows hidden = ResponseHidden(model_, sequences);
    int64_t first_row = 0;
    size_t first_sequence = 0;
    for (BatchUnit* unit : units) {
      const auto* score_unit = static_cast<ScoreUnit*>(unit);
      const std::vector<int64_t> counts(
          hidden.counts.begin() + static_cast<std::ptrdiff_t>(first_sequence),
          hidden.counts.begin() +
              static_cast<std::ptrdiff_t>(first_sequence + score_unit->sequences.size()));
      int64_t unit_rows = 0;
      for (int64_t count : counts) unit_rows += count;
      const torch::Tensor own = hidden.rows.narrow(0, first_row, unit_rows);
      const torch::Tensor values = score_unit->hidden ? own.to(torch::kCPU, torch::kFloat32)
                                                      : HeadLogProbs(model_, own, vocab_limit_);
      for (const torch::Tensor& part : values.split_with_sizes(counts, 0)) rows.push_back(part);
      first_row += unit_rows;
      first_sequence += score_unit->sequences.size();
    }
  }
  if (metrics_ != nullptr) {
    metrics_->RecordBatch(static_cast<int64_t>(sequences.size()),
                          absl::ToDoubleSeconds(absl::Now() - start));
  }
  size_t next = 0;
  for (BatchUnit* unit : units) {
    auto* score_unit = static_cast<ScoreUnit*>(unit);
    score_unit->rows.assign(
        rows.begin() + static_cast<std::ptrdiff_t>(next),
        rows.begin() + static_cast<std::ptrdiff_t>(next + score_unit->sequences.size()));
    next += score_unit->sequences.size();
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- Generate

absl::Status TeacherService::ValidateGenerateRequest(
    const kappa::v1::GenerateRequest& request) const {
  if (absl::Status st = ValidateTokenIds(request.prompt_tokens(), "prompt_tokens", vocab_size_);
      !st.ok()) {
    return st;
  }
  if (request.num_samples() < 1 || request.num_samples() > options_.max_generate_samples) {
    return absl::InvalidArgumentError(absl::StrCat("num_samples: must be in [1, ",
                                                   options_.max_generate_samples, "], got ",
                                                   request.num_samples()));
  }
  if (request.max_new_tokens() < 1 || request.max_new_tokens() > max_new_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens: must be in [1, ",
                                                   max_new_tokens_, "], got ",
                                                   request.max_new_tokens()));
  }
  const int64_t total = static_cast<int64_t>(request.prompt_tokens_size()) + request.max_new_tokens();
  if (total > max_positions_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens: prompt of ", request.prompt_tokens_size(), " tokens + ",
        request.max_new_tokens(), " new tokens exceed max_position_embeddings ", max_positions_));
  }
  if (absl::Status budget = WithinBudget("num_samples", request.num_samples() * total);
      !budget.ok()) {
    return budget;
  }
  if (!std::isfinite(request.temperature()) || request.temperature() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be > 0 (0 means 1.0), got ", request.temperature()));
  }
  if (!std::isfinite(request.top_p()) || request.top_p() < 0 || request.top_p() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p: must be in (0, 1] (0 means 1.0), got ", request.top_p()));
  }
  return absl::OkStatus();
}

grpc::Status TeacherService::Generate(grpc::ServerContext* context,
                                      const kappa::v1::GenerateRequest* request,
                                      kappa::v1::GenerateResponse* response) {
  const absl::Time start = absl::Now();
  const grpc::Status status =
      Guarded("Generate", [&] { return GenerateImpl(*request, *context, response); });
  Record("generate", start, status, 0);
  return status;
}

absl::Status TeacherService::GenerateImpl(const kappa::v1::GenerateRequest& request,
                                          const grpc::ServerContext& context,
                                          kappa::v1::GenerateResponse* response) {
  if (absl::Status st = ValidateGenerateRequest(request); !st.ok()) return st;
  // Checked before each decode step: the model is not held for a caller
  // that went away or whose deadline passed (also while waiting for it).
  const absl::Time deadline = DeadlineOf(&context);
  const auto stopped = [&] { return services::CallStillWanted(context, deadline, "Generate"); };

  const std::vector<int64_t> prompt(request.prompt_tokens().begin(), request.prompt_tokens().end());
  const std::vector<std::vector<int64_t>> prompts(request.num_samples(), prompt);
  model::SamplingParams params;
  params.max_new_tokens = request.max_new_tokens();
  params.temperature = request.temperature() == 0 ? 1.0 : request.temperature();
  params.top_p = request.top_p() == 0 ? 1.0 : request.top_p();
  params.stop_token_ids = stop_token_ids_;
  params.sampleable_vocab_size = vocab_limit_;
  params.should_stop = [&] { return !stopped().ok(); };

  uint64_t seed = request.seed();
  if (seed == 0) seed = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();

  std::vector<model::SampledSequence> samples;
  {
    absl::MutexLock lock(&model_mu_);
    params.pad_id = model_->config().pad_token_id;
    std::optional<at::Generator> generator;
    // A CPU generator only drives CPU sampling; on an accelerator the global
    // RNG is used (seeded per request).
    if (model_->lm_head()->weight.device().is_cpu()) {
      generator = at::detail::createCPUGenerator(seed);
    } else {
      torch::manual_seed(seed);
    }
    if (absl::Status st = stopped(); !st.ok()) return st;  // waited for the model too long
    samples = model::Sample(model_, prompts, params, generator);
  }
  if (absl::Status st = stopped(); !st.ok()) return st;

  for (const model::SampledSequence& sample : samples) {
    kappa::v1::GeneratedSample* out = response->add_samples();
    out->mutable_tokens()->Reserve(static_cast<int>(sample.tokens.size()));
    for (int64_t token : sample.tokens) out->add_tokens(static_cast<int32_t>(token));
    services::SetFloat32(out->mutable_logprobs(), {static_cast<int64_t>(sample.logprobs.size())},
                         sample.logprobs.data());
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- Info

grpc::Status TeacherService::Info(grpc::ServerContext* /*context*/,
                                  const kappa::v1::InfoRequest* /*request*/,
                                  kappa::v1::InfoResponse* response) {
  return Guarded("Info", [&] {
    response->set_vocab_size(static_cast<int32_t>(vocab_limit_));
    response->set_max_sequence_length(static_cast<int32_t>(max_positions_));
    response->set_hidden_size(static_cast<int32_t>(hidden_size_));
    if (!options_.model_name.empty()) {
      response->set_model_name(options_.model_name);
    } else {
      absl::MutexLock lock(&model_mu_);
      response->set_model_name(model_->config().name);
    }
    return absl::OkStatus();
  });
}

}  // namespace kappa::teacher
