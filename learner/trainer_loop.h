// The learner's training loop: take a batch of scored groups, run one hybrid
// step (L_R and L_D, κ and K_DR monitors, M3 / RSTG), feed the alarms,
// publish the new policy version, evaluate and checkpoint on schedule, and
// log one metrics.jsonl line per step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "learner/algo/alarms.h"
#include "learner/algo/hybrid_step.h"
#include "learner/algo/optimizer_step.h"
#include "learner/algo/teacher_head.h"
#include "learner/conflict_atlas.h"
#include "learner/coordinator.h"
#include "learner/corrupted_subset.h"
#include "learner/data_parallel_setup.h"
#include "learner/learner_metrics.h"
#include "learner/metrics_log.h"
#include "learner/policy_publisher.h"
#include "learner/prompt_encoder.h"
#include "learner/run_state.h"
#include "learner/step_record.h"
#include "learner/tensorboard_log.h"
#include "model/transformer.h"
#include "services/config.h"
#include "tasks/dataset.h"

namespace kappa::learner {

class TrainerLoop {
 public:
  // A loop ready to Run, built complete from the configuration and where
  // the run starts (`start`: a fresh run's step 0, or the checkpoint's state
  // on --resume), after Reverb's RateLimiter(const RateLimiterCheckpoint&).
  // Builds the HybridStep (which takes `optimizer`) and the alarm monitor,
  // continues the λ controller and the alarms from `start`, and creates
  // run_dir/checkpoints. INVALID_ARGUMENT naming the key on a bad
  // balancing/gating/monitor/alarm setting (or a `start` they refuse);
  // nothing runs and nothing is published.
  //
  // Data parallel (`rank`): every rank trains on its local share of each
  // step's groups (the optimizer holds the collectives) and checkpoints into
  // its own `run_dir`; only the primary rank evaluates and writes
  // metrics.jsonl. `vocab_limit`: the ids the student's distributions are
  // over in the losses and the evaluation (model::VocabLimit of the
  // tokenizer's size; 0: every row); the work items carry the same.
  // Not owned, and must outlive the loop: coordinator, publisher, heldout,
  // prompts.
  static absl::StatusOr<std::unique_ptr<TrainerLoop>> Create(
      const services::Config& config, std::string run_dir, model::Decoder student,
      std::unique_ptr<PolicyOptimizer> optimizer, const TrainerState& start,
      Coordinator* coordinator, PolicyPublisher* publisher, const tasks::Dataset& heldout,
      const PromptEncoder& prompts, int64_t vocab_limit, DataParallelSetup rank = {});

  TrainerLoop(const TrainerLoop&) = delete;
  TrainerLoop& operator=(const TrainerLoop&) = delete;

  // Publishes the starting policy, evaluates step 0 (a fresh run), then
  // trains until trainer.steps are done or `stop_requested` returns true
  // (CANCELLED). INTERNAL naming the step and the term once
  // trainer.max_nonfinite_steps steps in a row were skipped as non-finite
  // (nothing of them applied); a failed final checkpoint's error.
  absl::Status Run(const std::function<bool()>& stop_requested);

  // Also export each step to Prometheus (may stay null: no metrics).
  void set_metrics(LearnerMetrics* metrics) { metrics_exporter_ = metrics; }

  // Report accuracy and K_DR on the subset a corrupted teacher answers
  // wrongly apart from the rest (teacher.bootstrap.corrupt). Call before Run.
  void set_corrupted_subset(std::unique_ptr<CorruptedSubset> subset) {
    subset_ = std::move(subset);
  }

  // teacher.rows: hidden: the teacher's head every batch's hidden rows are
  // read with (set on each batch, TrainBatch::teacher_head). Call before Run.
  void set_teacher_head(TeacherHead head) { teacher_head_ = std::move(head); }

  // Append each step's most negative K_DR positions to the conflict atlas
  // (primary rank only). Call before Run.
  void set_conflict_atlas(std::unique_ptr<ConflictAtlas> atlas) { atlas_ = std::move(atlas); }

  // Fault injection for tests (kappa-learner --debug-nan-grad): the first
  // `tries` batches trained at `step` find NaN in the first trainable
  // parameter's gradient (an autograd hook), so the non-finite guard skips
  // them. Call before Run.
  void InjectNanGradient(int64_t step, int64_t tries);
  // Fault injection for tests (kappa-learner --debug-bad-group): the first
  // group taken for `step` gets a non-finite reward after the wire checks,
  // so BuildTrainBatch refuses it (TakeTrainableBatch drops it). Call
  // before Run.
  void InjectBadGroup(int64_t step) { bad_group_step_ = step; }
  // Fault injection for tests (kappa-learner --debug-step-throw): the first
  // `tries` steps tried at `step` throw inside the step (OnFailedStep).
  void InjectStepThrow(int64_t step, int64_t tries) {
    throw_at_step_ = step;
    throws_left_ = tries;
  }

  struct HeldOutResult {
    double accuracy = 0.0;
    std::map<std::string, double> by_subset;  // with a corrupted subset only
  };
  // Greedy accuracy on the held-out split (trainer.eval_examples of it).
  HeldOutResult EvaluateHeldOut();

 private:
  // Create's: every part already built and validated.
  TrainerLoop(const services::Config& config, std::string run_dir, model::Decoder student,
              std::unique_ptr<HybridStep> step, std::unique_ptr<AlarmMonitor> alarms,
              const TrainerState& start, Coordinator* coordinator, PolicyPublisher* publisher,
              const tasks::Dataset& heldout, const PromptEncoder& prompts, int64_t vocab_limit,
              DataParallelSetup rank);

  void PublishPolicy();
  absl::Status SaveCheckpoint(int64_t step);
  // `count` buffered groups and their batch, waiting for them (nullopt when
  // `stop_requested` meanwhile). A group the batch cannot be built from
  // (BadGroupError: a sample that passed the wire checks but not
  // BuildTrainBatch's) is dropped, never the process: logged, counted
  // (kappa_learner_groups_refused_total{reason="batch"}), its prompt leased
  // again; the next buffered group takes its place, so every step (every
  // data-parallel rank) trains on `count` groups.
  struct TrainableBatch {
    std::vector<BufferedGroup> buffered;  // in batch order
    TrainBatch batch;
  };
  absl::StatusOr<std::optional<TrainableBatch>> TakeTrainableBatch(
      size_t count, const std::function<bool()>& stop_requested);
  // One optimizer step on `taken`, and the new policy published: the
  // record of the batch, the step and its timing (alarms and evaluation not
  // yet). Mutates state_ (step, policy version) and last_step_end_. A step
  // the optimizer skipped as non-finite changes and publishes nothing: its
  // record has the step it tried and report.stats.skipped().
  absl::StatusOr<StepRecord> TrainOn(const TrainableBatch& taken, absl::Time run_start);
  // K_DR of the step's rows by subset, into `record` (with a subset and a
  // K_DR measurement only). `buffered`: the step's groups, in batch order.
  void ReportKdrBySubset(const std::vector<BufferedGroup>& buffered, int64_t group_size,
                         const torch::Tensor& response_mask, StepRecord& record) const;
  // The step's most negative K_DR positions to the atlas (with an atlas and
  // a K_DR measurement only); a failed write is logged and counted.
  void RecordConflicts(const std::vector<BufferedGroup>& buffered, const TrainBatch& batch,
                       const StepRecord& record);
  // The record's alarms, and its held-out accuracy when an evaluation is due.
  void Observe(StepRecord& record);
  // The record to its sinks: metrics.jsonl, Prometheus, the log.
  void Publish(const StepRecord& record);
  // Appends to metrics.jsonl; a failed write is logged and counted, the
  // record waits for space (metrics_log.h).
  void LogRecord(const nlohmann::json& record);
  // SaveCheckpoint; when it fails before the last step (a full disk), the
  // partial step directory is removed, `latest` keeps the previous one, the
  // failure is logged and counted, and training goes on. A failed final
  // checkpoint is the run's error.
  absl::Status CheckpointOrCarryOn(int64_t step);
  // After a step skipped as non-finite: the `ALARM nonfinite` log line and
  // kappa_learner_steps_skipped_total; once trainer.max_nonfinite_steps
  // steps in a row were skipped, an error naming the step and the term.
  absl::Status OnSkippedStep(const StepRecord& record);
  // After a step that threw (`failure`; not one skipped as non-finite): on a
  // single rank, the batch is dropped, its prompts leased again, the
  // `ALARM step_failed` line logged and kappa_learner_steps_skipped_total
  // {reason="exception"} counted; the next batch is trained. An error
  // instead once trainer.max_nonfinite_steps steps in a row failed, or with
  // data-parallel ranks (the others wait for this one in the step's
  // collectives).
  absl::Status OnFailedStep(const TrainableBatch& taken, const absl::Status& failure);

  const services::Config config_;
  const std::string run_dir_;
  model::Decoder student_;
  const std::unique_ptr<HybridStep> step_;  // owns the optimizer
  const std::unique_ptr<AlarmMonitor> alarms_;
  TrainerState state_;
  TeacherHead teacher_head_;  // undefined unless teacher.rows: hidden
  Coordinator* const coordinator_;
  PolicyPublisher* const publisher_;
  const tasks::Dataset& heldout_;
  const PromptEncoder& prompts_;  // the held-out evaluation's
  const int64_t vocab_limit_;
  const DataParallelSetup rank_;
  std::unique_ptr<MetricsLog> metrics_;  // the primary rank's
  // The primary rank's, with logging.tensorboard: the same records as
  // metrics_, as TensorBoard scalars.
  std::unique_ptr<TensorBoardLog> tensorboard_;
  LearnerMetrics* metrics_exporter_ = nullptr;
  // With LoRA: host copies of the frozen weights in the snapshot dtype,
  // made at the first publication and shared by every version's snapshot.
  std::vector<std::pair<std::string, torch::Tensor>> frozen_snapshot_weights_;
  std::unique_ptr<CorruptedSubset> subset_;  // may stay null
  std::unique_ptr<ConflictAtlas> atlas_;     // may stay null
  absl::Time last_step_end_;                 // of the previous step (or the loop's start)
  int64_t failed_in_a_row_ = 0;              // steps that threw since the last one applied
  int64_t skipped_in_a_row_ = 0;             // steps skipped as non-finite since the last applied
  struct NanFault {
    int64_t step = 0;           // 0: no fault
    int64_t tries = 0;          // batches at `step` still to poison
    bool armed = false;         // the batch being trained gets a NaN gradient
  } nan_fault_;                 // InjectNanGradient
  int64_t bad_group_step_ = 0;  // InjectBadGroup; 0: none (or done)
  int64_t throw_at_step_ = 0;   // InjectStepThrow; 0: none
  int64_t throws_left_ = 0;
};

}  // namespace kappa::learner
