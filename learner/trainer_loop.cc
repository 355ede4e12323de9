#include "learner/trainer_loop.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "learner/algo/train_batch.h"
#include "learner/dataset_accuracy.h"
#include "learner/step_config.h"
#include "learner/step_record.h"
#include "model/checkpoint.h"

namespace kappa::learner {
namespace {

std::vector<ScoredGroup> TakeGroups(std::vector<BufferedGroup>& buffered) {
  std::vector<ScoredGroup> groups;
  groups.reserve(buffered.size());
  for (BufferedGroup& entry : buffered) groups.push_back(std::move(entry.group));
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

}  // namespace

TrainerLoop::TrainerLoop(const services::Config& config, std::string run_dir,
                         model::Decoder student, std::unique_ptr<PolicyOptimizer> optimizer,
                         const TrainerState& start, Coordinator* coordinator,
                         PolicyPublisher* publisher, const tasks::Dataset& heldout,
                         const PromptEncoder& prompts, int64_t vocab_limit, DataParallelSetup rank)
    : config_(config),
      run_dir_(std::move(run_dir)),
      student_(std::move(student)),
      optimizer_(std::move(optimizer)),
      state_(start),
      coordinator_(coordinator),
      publisher_(publisher),
      heldout_(heldout),
      prompts_(prompts),
      vocab_limit_(vocab_limit),
      rank_(std::move(rank)),
      metrics_(rank_.primary() ? std::make_unique<MetricsLog>(run_dir_ + "/metrics.jsonl")
                               : nullptr) {}

void TrainerLoop::PublishPolicy() {
  auto snapshot = std::make_shared<PolicySnapshot>();
  snapshot->version = state_.policy_version;
  snapshot->model_config_json = student_->config().ToJson();
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : model::NamedWeights(student_)) {
    snapshot->weights.emplace_back(name,
                                   tensor.detach().to(torch::kCPU, torch::kFloat32).clone());
  }
  publisher_->Publish(std::move(snapshot));
}

double TrainerLoop::EvaluateHeldOut() {
  return DatasetAccuracy(student_, prompts_, heldout_,
                         static_cast<size_t>(config_.trainer.eval_examples),
                         config_.rollout.max_new_tokens, vocab_limit_);
}

absl::Status TrainerLoop::SaveCheckpoint(int64_t step) {
  const std::string dir = CheckpointDir(run_dir_, step);
  try {
    model::SaveCheckpoint(dir, student_);
    step_->optimizer().Save(dir + "/optimizer.pt");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("checkpoint ", dir, ": ", e.what()));
  }
  const DataPosition position = coordinator_->data_position();
  state_.data_position = position.drawn;
  state_.pending_prompts.assign(position.pending.begin(), position.pending.end());
  if (absl::Status status = WriteTrainerState(dir, state_); !status.ok()) return status;
  return MarkLatest(run_dir_, dir);
}

absl::Status TrainerLoop::Run(const std::function<bool()>& stop_requested) {
  absl::StatusOr<HybridStepConfig> step_config = MakeHybridStepConfig(config_);
  if (!step_config.ok()) return step_config.status();
  step_config->loss.vocab_limit = vocab_limit_;
  try {
    step_ = std::make_unique<HybridStep>(student_, std::move(optimizer_), *std::move(step_config));
    alarms_ = std::make_unique<AlarmMonitor>(MakeAlarmConfig(config_));
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(e.what());
  }
  spdlog::info("learner: distill_gate={} balance={} lambda={} kappa_every={} kdr_every={}",
               DistillGateName(step_->config().gate), BalanceName(step_->config().balance),
               step_->lambda(), step_->config().monitor.kappa_every,
               step_->config().monitor.kdr_every);
  std::filesystem::create_directories(run_dir_ + "/checkpoints");
  PublishPolicy();
  const absl::Time run_start = absl::Now();
  if (state_.step == 0 && rank_.primary()) {
    const double accuracy = EvaluateHeldOut();
    spdlog::info("step 0: held-out accuracy {:.3f}", accuracy);
    metrics_->Write({{"step", 0},
                    {"policy_version", state_.policy_version},
                    {"eval_accuracy", accuracy},
                    {"elapsed_seconds", 0.0}});
  }
  absl::Time last_step_end = absl::Now();
  while (state_.step < config_.trainer.steps) {
    if (stop_requested()) return absl::CancelledError("stop requested");
    // Data parallel: this rank's share; the step sums over the ranks.
    const int64_t local_groups = rank_.local_groups_per_step > 0 ? rank_.local_groups_per_step
                                                                 : config_.trainer.groups_per_step;
    std::vector<BufferedGroup> buffered = coordinator_->TakeBatch(
        static_cast<size_t>(local_groups), state_.policy_version, absl::Now() + absl::Seconds(1));
    if (buffered.empty()) continue;
    const absl::Time step_start = absl::Now();
    nlohmann::json lease_ids = nlohmann::json::array();
    nlohmann::json group_versions = nlohmann::json::array();
    for (const BufferedGroup& entry : buffered) {
      lease_ids.push_back(entry.lease_id);
      group_versions.push_back(entry.group.policy_version);
    }
    std::vector<ScoredGroup> groups = TakeGroups(buffered);

    // Per group: policy versions between sampling and this step.
    std::vector<int64_t> staleness;
    double staleness_sum = 0.0;
    int64_t tokens = 0;
    for (const ScoredGroup& group : groups) {
      staleness.push_back(state_.policy_version - group.policy_version);
      staleness_sum += static_cast<double>(staleness.back());
      for (const ScoredSample& sample : group.samples) {
        tokens += static_cast<int64_t>(sample.response_tokens.size());
      }
    }
    // Padding positions are masked out of every term; id 0 exists in every
    // vocabulary.
    TrainBatch batch =
        BuildTrainBatch(groups, config_.trainer.norm_std, /*pad_id=*/0, step_->config().truncated);
    HybridStepReport report;
    try {
      report = step_->Run(batch);
    } catch (const std::exception& e) {  // c10::Error included: stop at the edge, with a status
      return absl::InternalError(absl::StrCat("training step ", state_.step + 1, ": ", e.what()));
    }
    const StepStats& stats = report.stats;
    ++state_.step;
    state_.policy_version = state_.step;
    PublishPolicy();

    const absl::Time now = absl::Now();
    const double interval = absl::ToDoubleSeconds(now - last_step_end);
    last_step_end = now;
    const int64_t samples = batch.num_groups * batch.group_size;
    const CoordinatorCounters counters = coordinator_->counters();
    const double reward_mean = batch.rewards.mean().item<double>();
    // Share of this step's responses that hit their token budget (before
    // trainer.truncated acted on them).
    const double truncated_fraction =
        static_cast<double>(batch.num_truncated) / static_cast<double>(samples);
    nlohmann::json record = {
        {"step", state_.step},
        {"policy_version", state_.policy_version},
        {"reward_mean", reward_mean},
        {"truncated_fraction", truncated_fraction},
        {"samples", samples},
        {"tokens", tokens},
        {"samples_per_second", interval > 0 ? samples / interval : 0.0},
        {"staleness_mean", staleness_sum / static_cast<double>(groups.size())},
        {"groups_accepted", counters.groups_accepted},
        {"groups_consumed", counters.groups_consumed},
        {"groups_dropped_stale", counters.dropped_stale},
        {"groups_dropped_unknown_lease", counters.dropped_unknown_lease},
        {"leases_reissued", counters.leases_reissued},
        {"buffer_groups", counters.buffered},
        {"step_seconds", absl::ToDoubleSeconds(now - step_start)},
        {"elapsed_seconds", absl::ToDoubleSeconds(now - run_start)},
        // Which leases and policy versions fed this step: lets tests and
        // reports check that no group is consumed twice and that workers
        // sample with fresh weights.
        {"lease_ids", std::move(lease_ids)},
        {"group_versions", std::move(group_versions)},
    };
    AddStepReport(report, record);
    const std::vector<AlarmEvent> events = alarms_->Observe(
        ObservationOf(state_.step, report, reward_mean, report.distill_positions > 0));
    for (const AlarmEvent& event : events) {
      spdlog::warn("ALARM {} at step {}: {}", AlarmName(event.kind), event.step, event.message);
    }
    AddAlarms(events, *alarms_, record);
    const bool last = state_.step == config_.trainer.steps;
    if (rank_.primary() &&
        ((config_.trainer.eval_every > 0 && state_.step % config_.trainer.eval_every == 0) ||
         last)) {
      record["eval_accuracy"] = EvaluateHeldOut();
    }
    if (metrics_ != nullptr) metrics_->Write(record);
    if (metrics_exporter_ != nullptr) {
      StepObservationForMetrics observed;
      observed.step = state_.step;
      observed.policy_version = state_.policy_version;
      observed.reward_mean = reward_mean;
      observed.truncated_fraction = truncated_fraction;
      observed.tokens = tokens;
      observed.step_seconds = record["step_seconds"].get<double>();
      observed.staleness = std::move(staleness);
      if (record.contains("eval_accuracy")) {
        observed.eval_accuracy = record["eval_accuracy"].get<double>();
      }
      metrics_exporter_->RecordStep(observed, report, events, *alarms_);
    }
    spdlog::info("step {}: reward {:.3f} L_R {:.4f} L_D {:.4f} |g| {:.3f} kappa {}{}",
                 state_.step, reward_mean, stats.reward_loss, stats.distill_loss, stats.grad_norm,
                 stats.kappa() ? absl::StrCat(*stats.kappa()) : "-",
                 record.contains("eval_accuracy")
                     ? absl::StrCat(" eval ", record["eval_accuracy"].get<double>())
                     : "");
    if ((config_.trainer.checkpoint_every > 0 &&
         state_.step % config_.trainer.checkpoint_every == 0) ||
        last) {
      if (absl::Status status = SaveCheckpoint(state_.step); !status.ok()) return status;
    }
  }
  // Data-parallel ranks must end bit-identical; this line lets anyone (and
  // the end-to-end test) compare their logs.
  spdlog::info("final parameters: rank {} of {}, fingerprint {:016x}", rank_.rank,
               rank_.world_size, ParameterFingerprint(student_));
  return absl::OkStatus();
}

}  // namespace kappa::learner
