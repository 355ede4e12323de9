#include "learner/trainer_loop.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "learner/algo/train_batch.h"
#include "learner/dataset_accuracy.h"
#include "learner/policy_snapshot_dtype.h"
#include "learner/step_config.h"
#include "learner/step_record.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"

namespace kappa::learner {
namespace {

// Host copies of `tensors` in `dtype` (copy=true: never the live tensor).
std::vector<std::pair<std::string, torch::Tensor>> HostCopies(
    const std::map<std::string, torch::Tensor>& tensors, torch::ScalarType dtype) {
  std::vector<std::pair<std::string, torch::Tensor>> copies;
  copies.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    copies.emplace_back(name, tensor.detach().to(torch::TensorOptions(torch::kCPU).dtype(dtype),
                                                 /*non_blocking=*/false, /*copy=*/true));
  }
  return copies;
}

// adapter_config.json's base_model_name_or_path: the student's directory,
// absolute, so the adapter loads from anywhere on this machine.
std::string StudentBaseName(const services::Config& config) {
  return std::filesystem::absolute(services::StudentModelDir(config)).lexically_normal().string();
}

// The groups of `buffered`, copied (their tensors are shared, not copied),
// so a group BuildTrainBatch refuses can be left out and the rest rebuilt.
std::vector<ScoredGroup> GroupsOf(const std::vector<BufferedGroup>& buffered) {
  std::vector<ScoredGroup> groups;
  groups.reserve(buffered.size());
  for (const BufferedGroup& entry : buffered) groups.push_back(entry.group);
  return groups;
}

// FNV-1a over every parameter's float32 bytes: equal only if bitwise equal.
uint64_t ParameterFingerprint(model::Decoder& model) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& p : model->parameters()) {
    const torch::Tensor bytes = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const auto* data = static_cast<const unsigned char*>(bytes.data_ptr());
    for (int64_t i = 0; i < bytes.numel() * 4; ++i) hash = (hash ^ data[i]) * 0x100000001b3ULL;
  }
  return hash;
}

// What checkpoints/latest names now, for the messages that say it was kept.
std::string DescribeLatest(const std::string& run_dir) {
  absl::StatusOr<std::optional<std::string>> latest = FindLatest(run_dir);
  return latest.ok() && latest->has_value()
             ? absl::StrCat("checkpoints/latest still names ",
                            std::filesystem::path(**latest).filename().string())
             : std::string("there is no earlier checkpoint");
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerLoop>> TrainerLoop::Create(
    const services::Config& config, std::string run_dir, model::Decoder student,
    std::unique_ptr<PolicyOptimizer> optimizer, const TrainerState& start, Coordinator* coordinator,
    PolicyPublisher* publisher, const tasks::Dataset& heldout, const PromptEncoder& prompts,
    int64_t vocab_limit, DataParallelSetup rank) {
  KAPPA_ASSIGN_OR_RETURN(HybridStepConfig step_config, MakeHybridStepConfig(config));
  step_config.loss.vocab_limit = vocab_limit;
  std::unique_ptr<HybridStep> step;
  std::unique_ptr<AlarmMonitor> alarms;
  KAPPA_RETURN_IF_ERROR(base::CaptureExceptions("", [&] {
    step = std::make_unique<HybridStep>(student, std::move(optimizer), std::move(step_config));
    alarms = std::make_unique<AlarmMonitor>(MakeAlarmConfig(config));
  }));
  // A resumed run continues the λ controller and the alarms where they were.
  KAPPA_RETURN_IF_ERROR(RestoreMonitors(start, step->lambda_controller(), alarms.get()));
  KAPPA_RETURN_IF_ERROR(base::CaptureExceptions(
      "run directory", [&] { std::filesystem::create_directories(run_dir + "/checkpoints"); }));
  spdlog::info("learner: distill_gate={} balance={} lambda={} kappa_every={} kdr_every={}",
               DistillGateName(step->config().gate), BalanceName(step->config().balance),
               step->lambda(), step->config().monitor.kappa_every,
               step->config().monitor.kdr_every);
  return std::unique_ptr<TrainerLoop>(new TrainerLoop(
      config, std::move(run_dir), std::move(student), std::move(step), std::move(alarms), start,
      coordinator, publisher, heldout, prompts, vocab_limit, std::move(rank)));
}

TrainerLoop::TrainerLoop(const services::Config& config, std::string run_dir,
                         model::Decoder student, std::unique_ptr<HybridStep> step,
                         std::unique_ptr<AlarmMonitor> alarms, const TrainerState& start,
                         Coordinator* coordinator, PolicyPublisher* publisher,
                         const tasks::Dataset& heldout, const PromptEncoder& prompts,
                         int64_t vocab_limit, DataParallelSetup rank)
    : config_(config),
      run_dir_(std::move(run_dir)),
      student_(std::move(student)),
      step_(std::move(step)),
      alarms_(std::move(alarms)),
      state_(start),
      coordinator_(coordinator),
      publisher_(publisher),
      heldout_(heldout),
      prompts_(prompts),
      vocab_limit_(vocab_limit),
      rank_(std::move(rank)),
      metrics_(rank_.primary() ? std::make_unique<MetricsLog>(run_dir_ + "/metrics.jsonl")
                               : nullptr),
      tensorboard_(rank_.primary() && config_.logging.tensorboard
                       ? std::make_unique<TensorBoardLog>(run_dir_)
                       : nullptr) {}

void TrainerLoop::InjectNanGradient(int64_t step, int64_t tries) {
  if (nan_fault_.step == 0) {
    step_->optimizer().parameters().front().register_hook(
        [armed = &nan_fault_.armed](const torch::Tensor& grad) {
          // NaN in every value the gradient holds, in its own layout (the token
          // lookup's is sparse: Decoder::SetSparseEmbeddingGradient).
          return *armed ? grad * std::numeric_limits<float>::quiet_NaN() : grad;
        });
  }
  nan_fault_ = {step, tries, false};
}

void TrainerLoop::PublishPolicy() {
  auto snapshot = std::make_shared<PolicySnapshot>();
  snapshot->version = state_.policy_version;
  snapshot->model_config_json = student_->config().ToJson();
  snapshot->dtype = PolicySnapshotDtype(config_);
  const absl::Time start = absl::Now();
  torch::NoGradGuard no_grad;
  if (student_->has_lora()) {
    snapshot->adapter_config_json =
        model::AdapterConfigJson(student_->lora_config(), StudentBaseName(config_));
    // The frozen weights are copied once; every version shares the copies.
    if (frozen_snapshot_weights_.empty()) {
      frozen_snapshot_weights_ = HostCopies(model::NamedWeights(student_), snapshot->dtype);
    }
    snapshot->weights = frozen_snapshot_weights_;
    snapshot->frozen_weights = static_cast<int64_t>(frozen_snapshot_weights_.size());
  }
  const std::vector<std::pair<std::string, torch::Tensor>> trained = HostCopies(
      student_->has_lora() ? model::NamedAdapters(student_) : model::NamedWeights(student_),
      snapshot->dtype);
  snapshot->weights.insert(snapshot->weights.end(), trained.begin(), trained.end());
  int64_t bytes = 0;
  for (const auto& [name, copy] : trained) bytes += static_cast<int64_t>(copy.nbytes());
  spdlog::info("policy version {} snapshot: {:.2f} MiB {}{} in {:.2f} s", snapshot->version,
               static_cast<double>(bytes) / (1 << 20), c10::toString(snapshot->dtype),
               student_->has_lora() ? " of adapters" : "",
               absl::ToDoubleSeconds(absl::Now() - start));
  publisher_->Publish(std::move(snapshot));
}

TrainerLoop::HeldOutResult TrainerLoop::EvaluateHeldOut() {
  const std::vector<bool> correct = DatasetCorrectness(
      student_, prompts_, heldout_, static_cast<size_t>(config_.trainer.eval_examples),
      config_.rollout.max_new_tokens, vocab_limit_);
  HeldOutResult result;
  if (!correct.empty()) {
    result.accuracy = static_cast<double>(std::count(correct.begin(), correct.end(), true)) /
                      static_cast<double>(correct.size());
  }
  if (subset_ == nullptr) return result;
  result.by_subset = subset_->AccuracyBySubset(correct);
  const tasks::Dataset& as_taught = subset_->covered_heldout_as_taught();
  if (as_taught.size() > 0) {
    result.by_subset[subset_->FollowedName()] =
        DatasetAccuracy(student_, prompts_, as_taught, as_taught.size(),
                        config_.rollout.max_new_tokens, vocab_limit_);
  }
  return result;
}

void TrainerLoop::ReportKdrBySubset(const std::vector<BufferedGroup>& buffered, int64_t group_size,
                                    const torch::Tensor& response_mask, StepRecord& record) const {
  if (subset_ == nullptr || !record.report.kdr_kernel.defined()) return;
  std::vector<bool> row_covered;  // row g·G + i is sample i of group g
  row_covered.reserve(buffered.size() * static_cast<size_t>(group_size));
  for (const BufferedGroup& entry : buffered) {
    row_covered.insert(row_covered.end(), static_cast<size_t>(group_size),
                       subset_->TrainCovered(entry.example_index));
  }
  record.kdr_by_subset = CorruptedSubset::KdrBySubset(subset_->name(), record.report.kdr_kernel,
                                                      response_mask, row_covered);
}

absl::Status TrainerLoop::SaveCheckpoint(int64_t step) {
  const std::string dir = CheckpointDir(run_dir_, step);
  const absl::Time start = absl::Now();
  KAPPA_RETURN_IF_ERROR(base::CaptureExceptions(absl::StrCat("checkpoint ", dir), [&] {
    if (student_->has_lora()) {
      model::SaveAdapter(dir, student_, student_->lora_config(), StudentBaseName(config_));
    } else {
      model::SaveCheckpoint(dir, student_);
    }
    step_->optimizer().Save(dir + "/optimizer.pt");
  }));
  spdlog::info("checkpoint {} written in {:.1f} s", dir,
               absl::ToDoubleSeconds(absl::Now() - start));
  const DataPosition position = coordinator_->data_position();
  state_.data_position = position.drawn;
  state_.pending_prompts.assign(position.pending.begin(), position.pending.end());
  const LambdaController* lambda = step_->lambda_controller();
  state_.lambda_controller =
      lambda != nullptr ? std::optional<LambdaControllerState>(lambda->state()) : std::nullopt;
  state_.alarms = alarms_->state();
  KAPPA_RETURN_IF_ERROR(WriteTrainerState(dir, state_));
  return MarkLatest(run_dir_, dir);
}

absl::Status TrainerLoop::CheckpointOrCarryOn(int64_t step) {
  const absl::Status status = SaveCheckpoint(step);
  if (status.ok()) return status;
  // What a failed write left behind only takes the space the next one needs.
  std::error_code ignored;
  std::filesystem::remove_all(CheckpointDir(run_dir_, step), ignored);
  if (metrics_exporter_ != nullptr) metrics_exporter_->RecordWriteFailure("checkpoint");
  const std::string kept = DescribeLatest(run_dir_);
  if (step == config_.trainer.steps) {
    return absl::Status(
        status.code(), absl::StrCat("the final checkpoint failed: ", status.message(), "; ", kept));
  }
  spdlog::error(
      "checkpoint at step {} failed: {}; {}; training goes on and checkpoints again at "
      "step {}",
      step, std::string(status.message()), kept, step + config_.trainer.checkpoint_every);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<TrainerLoop::TrainableBatch>> TrainerLoop::TakeTrainableBatch(
    size_t count, const std::function<bool()>& stop_requested) {
  std::vector<BufferedGroup> buffered;
  while (true) {
    if (stop_requested()) {
      // Groups held after a drop: their prompts go back, so the checkpoint's
      // pending prompts (data_position) still name them.
      std::vector<size_t> examples;
      for (const BufferedGroup& entry : buffered) examples.push_back(entry.example_index);
      coordinator_->Requeue(examples);
      return std::optional<TrainableBatch>();
    }
    std::vector<BufferedGroup> more = coordinator_->TakeBatch(
        count - buffered.size(), state_.policy_version, absl::Now() + absl::Seconds(1));
    std::move(more.begin(), more.end(), std::back_inserter(buffered));
    if (buffered.size() < count) continue;
    if (bad_group_step_ == state_.step + 1 && !buffered.front().group.samples.empty()) {
      buffered.front().group.samples.front().reward = std::numeric_limits<float>::quiet_NaN();
      bad_group_step_ = 0;
    }
    std::optional<TrainBatch> batch;
    std::optional<BadGroupError> refused;
    // Padding positions are masked out of every term; id 0 exists in every
    // vocabulary. c10::Error included: anything else stops at this edge.
    KAPPA_RETURN_IF_ERROR(base::CaptureExceptions("building the batch", [&] {
      try {
        batch = BuildTrainBatch(GroupsOf(buffered), config_.trainer.norm_std, /*pad_id=*/0,
                                step_->config().truncated, step_->config().advantage_std);
      } catch (const BadGroupError& error) {
        refused = error;
      }
    }));
    if (batch.has_value()) {
      batch->teacher_head = teacher_head_;
      return std::optional<TrainableBatch>({std::move(buffered), *batch});
    }
    const BufferedGroup& dropped = buffered[refused->group()];
    spdlog::error("group of lease {} (example {}) dropped: {}; its prompt is leased again",
                  dropped.lease_id, dropped.example_index, refused->what());
    if (metrics_exporter_ != nullptr) metrics_exporter_->RecordUnbatchableGroup();
    coordinator_->Requeue({dropped.example_index});
    buffered.erase(buffered.begin() + static_cast<std::ptrdiff_t>(refused->group()));
  }
}

absl::StatusOr<StepRecord> TrainerLoop::TrainOn(const TrainableBatch& taken, absl::Time run_start) {
  const std::vector<BufferedGroup>& buffered = taken.buffered;
  const TrainBatch& batch = taken.batch;
  const absl::Time step_start = absl::Now();
  StepRecord record;
  for (const BufferedGroup& entry : buffered) {
    record.lease_ids.push_back(entry.lease_id);
    record.group_versions.push_back(entry.group.policy_version);
    record.staleness.push_back(state_.policy_version - entry.group.policy_version);
    for (const ScoredSample& sample : entry.group.samples) {
      record.tokens += static_cast<int64_t>(sample.response_tokens.size());
    }
  }
  // The training–inference mismatch is measured on the groups sampled with
  // the weights this step starts from (this rank's share, data parallel).
  const torch::Tensor on_policy =
      OnPolicyRows(record.group_versions, batch.group_size, state_.policy_version);
  nan_fault_.armed = nan_fault_.step == state_.step + 1 && nan_fault_.tries > 0;
  if (nan_fault_.armed) --nan_fault_.tries;
  // c10::Error included: the step stops at this edge, with a status.
  const bool throw_now = throw_at_step_ == state_.step + 1 && throws_left_ > 0;
  if (throw_now) --throws_left_;
  KAPPA_ASSIGN_OR_RETURN(
      record.report, base::CaptureExceptions(absl::StrCat("training step ", state_.step + 1), [&] {
        if (throw_now) throw std::runtime_error("injected by --debug-step-throw");
        return step_->Run(batch, on_policy);
      }));
  if (record.report.stats.skipped()) {
    record.step = state_.step + 1;  // tried, not taken: nothing to publish
    return record;
  }
  ++state_.step;
  state_.policy_version = state_.step;
  PublishPolicy();
  record.step = state_.step;
  ReportKdrBySubset(buffered, batch.group_size, batch.response_mask, record);
  RecordConflicts(buffered, batch, record);

  const absl::Time now = absl::Now();
  record.policy_version = state_.policy_version;
  record.samples = batch.num_groups * batch.group_size;
  record.reward_mean = batch.rewards.mean().item<double>();
  // Before trainer.truncated acted on them.
  record.truncated_fraction =
      static_cast<double>(batch.num_truncated) / static_cast<double>(record.samples);
  record.counters = coordinator_->counters();
  record.step_seconds = absl::ToDoubleSeconds(now - step_start);
  record.interval_seconds = absl::ToDoubleSeconds(now - last_step_end_);
  record.elapsed_seconds = absl::ToDoubleSeconds(now - run_start);
  last_step_end_ = now;
  return record;
}

absl::Status TrainerLoop::OnSkippedStep(const StepRecord& record) {
  const StepStats& s = record.report.stats;
  const int64_t limit = config_.trainer.max_nonfinite_steps;
  ++skipped_in_a_row_;
  if (metrics_exporter_ != nullptr) metrics_exporter_->RecordSkippedStep("nonfinite");
  spdlog::warn(
      "ALARM nonfinite at step {}: {} is not finite (L_R {:.4g} L_D {:.4g} L_SFT {:.4g} "
      "|g| {:.4g}); the step was skipped: nothing applied, published or checkpointed ({} of "
      "{} in a row, trainer.max_nonfinite_steps)",
      record.step, s.nonfinite_term, s.reward_loss, s.distill_loss, s.sft_loss, s.grad_norm,
      skipped_in_a_row_, limit);
  if (skipped_in_a_row_ < limit) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "step ", record.step, ": ", s.nonfinite_term, " was not finite on ", skipped_in_a_row_,
      " batches in a row (trainer.max_nonfinite_steps), none of them applied; ",
      DescribeLatest(run_dir_)));
}

absl::Status TrainerLoop::OnFailedStep(const TrainableBatch& taken, const absl::Status& failure) {
  if (rank_.world_size > 1) return failure;
  const int64_t limit = config_.trainer.max_nonfinite_steps;
  ++failed_in_a_row_;
  if (failed_in_a_row_ >= limit) {
    return absl::Status(failure.code(),
                        absl::StrCat(failure.message(), " (", failed_in_a_row_,
                                     " batches in a row, trainer.max_nonfinite_steps); ",
                                     DescribeLatest(run_dir_)));
  }
  std::vector<size_t> examples;
  for (const BufferedGroup& entry : taken.buffered) examples.push_back(entry.example_index);
  coordinator_->Requeue(examples);
  if (metrics_exporter_ != nullptr) metrics_exporter_->RecordSkippedStep("exception");
  spdlog::error(
      "ALARM step_failed at step {}: {}; the batch of {} groups was dropped, nothing applied, its "
      "prompts leased again ({} of {} in a row, trainer.max_nonfinite_steps)",
      state_.step + 1, std::string(failure.message()), taken.buffered.size(), failed_in_a_row_,
      limit);
  return absl::OkStatus();
}

void TrainerLoop::RecordConflicts(const std::vector<BufferedGroup>& buffered,
                                  const TrainBatch& batch, const StepRecord& record) {
  if (atlas_ == nullptr || !rank_.primary() || !record.report.kdr_kernel.defined()) return;
  std::vector<size_t> example_indices;
  example_indices.reserve(buffered.size());
  for (const BufferedGroup& entry : buffered) example_indices.push_back(entry.example_index);
  absl::Status written;
  const absl::Status thrown = base::CaptureExceptions("conflict atlas", [&] {
    written = atlas_->Record(record.step, batch, record.report.kdr_kernel, example_indices);
  });
  if (!thrown.ok()) written = thrown;
  if (!written.ok()) {
    spdlog::error("{}", std::string(written.message()));
    if (metrics_exporter_ != nullptr) metrics_exporter_->RecordWriteFailure("conflict_atlas");
  }
}

void TrainerLoop::Observe(StepRecord& record) {
  record.alarm_events = alarms_->Observe(ObservationOf(record));
  for (const AlarmEvent& event : record.alarm_events) {
    spdlog::warn("ALARM {} at step {}: {}", AlarmName(event.kind), event.step, event.message);
  }
  for (size_t k = 0; k < std::size(kAllAlarmKinds); ++k) {
    record.alarm_active[k] = alarms_->active(kAllAlarmKinds[k]);
  }
  const bool eval_due =
      (config_.trainer.eval_every > 0 && record.step % config_.trainer.eval_every == 0) ||
      record.step == config_.trainer.steps;
  if (rank_.primary() && eval_due) {
    HeldOutResult held_out = EvaluateHeldOut();
    record.eval_accuracy = held_out.accuracy;
    record.eval_accuracy_by_subset = std::move(held_out.by_subset);
  }
}

void TrainerLoop::LogRecord(const nlohmann::json& record) {
  // A full disk costs records, not the run (docs/reliability.md).
  if (absl::Status status = metrics_->Write(record); !status.ok()) {
    spdlog::error("{}", std::string(status.message()));
    if (metrics_exporter_ != nullptr) metrics_exporter_->RecordWriteFailure("metrics_log");
  }
  if (tensorboard_ == nullptr) return;
  if (absl::Status status = tensorboard_->Write(record.value("step", int64_t{0}), record);
      !status.ok()) {
    spdlog::error("{}", std::string(status.message()));
    if (metrics_exporter_ != nullptr) metrics_exporter_->RecordWriteFailure("tensorboard");
  }
}

void TrainerLoop::Publish(const StepRecord& record) {
  if (metrics_ != nullptr) LogRecord(ToJson(record));
  if (metrics_exporter_ != nullptr) metrics_exporter_->RecordStep(record);
  const StepStats& stats = record.report.stats;
  spdlog::info("step {}: reward {:.3f} L_R {:.4f} L_D {:.4f} |g| {:.3f} kappa {}{}", record.step,
               record.reward_mean, stats.reward_loss, stats.distill_loss, stats.grad_norm,
               stats.kappa() ? absl::StrCat(*stats.kappa()) : "-",
               record.eval_accuracy ? absl::StrCat(" eval ", *record.eval_accuracy) : "");
}

absl::Status TrainerLoop::Run(const std::function<bool()>& stop_requested) {
  PublishPolicy();
  const absl::Time run_start = absl::Now();
  if (state_.step == 0 && rank_.primary()) {
    const HeldOutResult held_out = EvaluateHeldOut();
    spdlog::info("step 0: held-out accuracy {:.3f}", held_out.accuracy);
    LogRecord(EvaluationJson(0, state_.policy_version, held_out.accuracy, held_out.by_subset));
  }
  last_step_end_ = absl::Now();
  while (state_.step < config_.trainer.steps) {
    if (stop_requested()) return absl::CancelledError("stop requested");
    // Data parallel: this rank's share; the step sums over the ranks.
    const int64_t local_groups = rank_.local_groups_per_step > 0 ? rank_.local_groups_per_step
                                                                 : config_.trainer.groups_per_step;
    KAPPA_ASSIGN_OR_RETURN(std::optional<TrainableBatch> taken,
                           TakeTrainableBatch(static_cast<size_t>(local_groups), stop_requested));
    if (!taken.has_value()) return absl::CancelledError("stop requested");
    absl::StatusOr<StepRecord> trained = TrainOn(*taken, run_start);
    if (!trained.ok()) {
      KAPPA_RETURN_IF_ERROR(OnFailedStep(*taken, trained.status()));
      continue;
    }
    StepRecord& record = *trained;
    failed_in_a_row_ = 0;
    if (record.report.stats.skipped()) {
      KAPPA_RETURN_IF_ERROR(OnSkippedStep(record));
      continue;
    }
    skipped_in_a_row_ = 0;
    Observe(record);
    Publish(record);
    const bool checkpoint_due = (config_.trainer.checkpoint_every > 0 &&
                                 state_.step % config_.trainer.checkpoint_every == 0) ||
                                state_.step == config_.trainer.steps;
    if (checkpoint_due) KAPPA_RETURN_IF_ERROR(CheckpointOrCarryOn(state_.step));
  }
  // Data-parallel ranks must end bit-identical; this line lets anyone (and
  // the end-to-end test) compare their logs.
  spdlog::info("final parameters: rank {} of {}, fingerprint {:016x}", rank_.rank,
               rank_.world_size, ParameterFingerprint(student_));
  return absl::OkStatus();
}

}  // namespace kappa::learner
