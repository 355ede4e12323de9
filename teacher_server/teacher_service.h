// kappa.v1.Teacher: Score (through the dynamic batcher), Generate (teacher
// samples for RSTG) and Info. Every handler validates its request first and
// answers INVALID_ARGUMENT naming the field; no exception escapes a handler.
// Score never sends a log-prob that is not finite: a NaN or infinity in the
// teacher's own output is INTERNAL naming the sequence and the response
// position (`sequences[i].logprobs: non-finite log-prob nan at response
// position t ...`), counted in kappa_teacher_nonfinite_logprobs_total.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kappa/v1/teacher.grpc.pb.h"
#include "model/transformer.h"
#include "teacher_server/dynamic_batcher.h"
#include "teacher_server/teacher_metrics.h"

namespace kappa::teacher {

struct TeacherOptions {
  DynamicBatcherOptions batching;
  // Reported by Info; empty: the model config's name.
  std::string model_name;
  // Score: most sequences one request may carry (larger requests are split
  // into batcher units of at most batching.max_batch_sequences).
  int64_t max_request_sequences = 1024;
  // Generate limits. max_new_tokens 0: up to max_position_embeddings.
  int64_t max_generate_samples = 64;
  int64_t max_new_tokens = 0;
  // Per-request cost budget in token positions (teacher.max_request_positions):
  // Score's prompt + response tokens over its sequences, Generate's
  // num_samples × (prompt + max_new_tokens). Over it: RESOURCE_EXHAUSTED.
  int64_t max_request_positions = 1 << 20;
  // Used when a client sets no deadline, so no handler waits forever.
  absl::Duration default_deadline = absl::Seconds(60);
  // The ids Score's distributions are over and Generate samples from:
  // model::VocabLimit of the tokenizer's size (HfTokenizer::vocab_size()),
  // so the padded embedding rows above it get no probability. Score
  // requests must carry the same vocab_size (the student's limit). 0: every
  // row of the model.
  int64_t vocab_limit = 0;
};

class TeacherService final : public kappa::v1::Teacher::Service {
 public:
  // Takes the model (switched to eval mode); starts the batching thread.
  // Generate ends responses at the model's stop ids (model::StopTokenIds,
  // read here once). INVALID_ARGUMENT for bad options or a malformed
  // generation_config.json. `metrics` (not owned, may be null: nothing
  // recorded) must outlive the service.
  static absl::StatusOr<std::unique_ptr<TeacherService>> Create(
      model::Decoder model, const TeacherOptions& options, TeacherMetrics* metrics = nullptr);
  ~TeacherService() override;

  grpc::Status Score(grpc::ServerContext* context, const kappa::v1::ScoreRequest* request,
                     kappa::v1::ScoreResponse* response) override;
  grpc::Status Generate(grpc::ServerContext* context, const kappa::v1::GenerateRequest* request,
                        kappa::v1::GenerateResponse* response) override;
  grpc::Status Info(grpc::ServerContext* context, const kappa::v1::InfoRequest* request,
                    kappa::v1::InfoResponse* response) override;

  // Stops batching: queued Score calls get UNAVAILABLE. Call after the gRPC
  // server has drained (or is shutting down). Idempotent.
  void Shutdown();

  // Request checks, public for tests. OK or INVALID_ARGUMENT naming the
  // field; RESOURCE_EXHAUSTED for a request over the cost budget.
  absl::Status ValidateScoreRequest(const kappa::v1::ScoreRequest& request) const;
  absl::Status ValidateGenerateRequest(const kappa::v1::GenerateRequest& request) const;

  DynamicBatcherStats batcher_stats() const { return batcher_->stats(); }

 private:
  TeacherService(model::Decoder model, const TeacherOptions& options, TeacherMetrics* metrics,
                 std::vector<int64_t> stop_token_ids);
  void Record(const char* method, absl::Time start, const grpc::Status& status,
              int64_t positions) const;

  // Both honour the call's deadline (or options.default_deadline) and its
  // cancellation: DEADLINE_EXCEEDED / CANCELLED, the model released.
  absl::Status ScoreImpl(const kappa::v1::ScoreRequest& request, const grpc::ServerContext& context,
                         kappa::v1::ScoreResponse* response);
  absl::Status GenerateImpl(const kappa::v1::GenerateRequest& request,
                            const grpc::ServerContext& context,
                            kappa::v1::GenerateResponse* response);
  // RESOURCE_EXHAUSTED naming `field` and teacher.max_request_positions
  // when `positions` exceed the per-request budget.
  absl::Status WithinBudget(const char* field, int64_t positions) const;
  // The batch function: one padded forward over every unit's sequences.
  absl::Status RunScoreBatch(const std::vector<BatchUnit*>& units) ABSL_LOCKS_EXCLUDED(model_mu_);
  absl::Time DeadlineOf(const grpc::ServerContext* context) const;

  const TeacherOptions options_;
  TeacherMetrics* const metrics_;
  const int64_t vocab_size_;   // the model's embedding rows: what a prompt id may be
  const int64_t vocab_limit_;  // the ids distributions are over: response ids, Score's V
  const int64_t max_positions_;
  const int64_t hidden_size_;  // D of SCORE_FORM_HIDDEN rows
  const std::vector<int64_t> stop_token_ids_;
  const int64_t max_new_tokens_;
  // Modules are not documented as safe for concurrent forwards (a KV cache or
  // lazily built tables may be mutated), so the batching thread and Generate
  // take turns.
  absl::Mutex model_mu_;
  model::Decoder model_ ABSL_GUARDED_BY(model_mu_);
  std::unique_ptr<DynamicBatcher> batcher_;
};

}  // namespace kappa::teacher
