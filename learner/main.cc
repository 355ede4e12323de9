// kappa-learner: the coordinator and trainer process.
//
//   kappa-learner --config FILE [key=value ...] [--run-dir DIR] [--resume]
//                 [--log-file FILE] [--address HOST:PORT] [--metrics-address HOST:PORT]
//                 [--world-size R --rank N|auto --dist-store URL]
//                 [--debug-nan-grad STEP[:TRIES]] [--debug-bad-group STEP]
//                 [--debug-step-throw STEP[:TRIES]]
//   kappa-learner --health-check HOST:PORT
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "learner/algo/optimizer_step.h"
#include "learner/checkpoint_set.h"
#include "learner/coordinator.h"
#include "learner/data_parallel_setup.h"
#include "learner/learner_metrics.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/prompt_encoder.h"
#include "learner/run_state.h"
#include "learner/step_config.h"
#include "learner/student_lora.h"
#include "learner/teacher_head_loader.h"
#include "learner/trainer_loop.h"
#include "learner/work_config.h"
#include "model/checkpoint.h"
#include "model/generation_config.h"
#include "model/peft_adapter.h"
#include "services/cli_flags.h"
#include "services/config.h"
#include "services/logging.h"
#include "services/metrics.h"
#include "services/metrics_server.h"
#include "services/ready_file.h"
#include "services/server.h"
#include "services/service_main.h"
#include "services/torch_runtime.h"
#include "tasks/from_config.h"

namespace kappa::learner {
namespace {

struct StartPoint {
  model::Decoder student{nullptr};
  TrainerState state;
  // Empty: a fresh optimizer. One: this rank's own state. More: every rank's
  // of a set written at another world size, to reshard.
  std::vector<std::string> optimizer_paths;
};

// What --resume starts this rank from: its own checkpoint of the newest
// complete set, or, when another number of ranks wrote the set, rank 0's
// weights, a trainer state resharded over the new ranks and every old
// rank's optimizer state (checkpoint_set.h). The checkpoint directory
// whose weights to load; empty when there is nothing to resume.
absl::StatusOr<std::string> ResumeFrom(const services::Config& config,
                                       const std::string& base_run_dir,
                                       const DataParallelSetup& rank, size_t dataset_size,
                                       StartPoint* start) {
  KAPPA_ASSIGN_OR_RETURN(const std::optional<CheckpointSet> set,
                         FindCheckpointSet(base_run_dir, rank.world_size));
  if (!set.has_value()) {
    spdlog::info("--resume: no checkpoint in {}, starting fresh", base_run_dir);
    return std::string();
  }
  if (set->world_size == rank.world_size) {
    start->state = set->states[rank.rank];
    start->optimizer_paths = {set->dirs[rank.rank] + "/optimizer.pt"};
    spdlog::info("resuming from {} (step {})", set->dirs[rank.rank], set->step);
    return set->dirs[rank.rank];
  }
  KAPPA_ASSIGN_OR_RETURN(start->state, ReshardTrainerState(*set, dataset_size, config.seed,
                                                           rank.rank, rank.world_size));
  for (const std::string& dir : set->dirs) start->optimizer_paths.push_back(dir + "/optimizer.pt");
  spdlog::info(
      "resuming step {} written by {} rank(s) as rank {} of {}: weights from {}, optimizer "
      "state resharded, prompts from position {} with {} pending",
      set->step, set->world_size, rank.rank, rank.world_size, set->dirs.front(),
      start->state.data_position, start->state.pending_prompts.size());
  return set->dirs.front();
}

// With student.lora: the student's weights from student.checkpoint, frozen,
// and its adapters fresh, or from `adapter_dir` (a resumed checkpoint).
absl::StatusOr<model::Decoder> LoadStudentWithAdapters(const std::string& base_dir,
                                                       const model::LoraConfig& lora,
                                                       const std::string& adapter_dir) {
  return base::CaptureExceptions(
      absl::StrCat("student checkpoint ", adapter_dir.empty() ? base_dir : adapter_dir),
      [&] {
        model::Decoder student = model::LoadCheckpoint(base_dir);
        TrainAdaptersOnly(student, lora);
        if (!adapter_dir.empty()) model::LoadAdapter(adapter_dir, student);
        return student;
      },
      absl::StatusCode::kFailedPrecondition);
}

absl::StatusOr<StartPoint> LoadStartPoint(const services::Config& config,
                                          const std::string& base_run_dir,
                                          const DataParallelSetup& rank, size_t dataset_size,
                                          bool resume) {
  StartPoint start;
  start.state.seed = services::RlSeed(config);
  KAPPA_ASSIGN_OR_RETURN(const std::optional<model::LoraConfig> lora, StudentLoraConfig(config));
  const std::string base_dir = services::StudentModelDir(config);
  std::string checkpoint = base_dir;
  if (resume) {
    KAPPA_ASSIGN_OR_RETURN(const std::string resumed,
                           ResumeFrom(config, base_run_dir, rank, dataset_size, &start));
    if (!resumed.empty()) checkpoint = resumed;
  }
  start.state.world_size = rank.world_size;
  const bool resumes_adapter = checkpoint != base_dir && model::AdapterExists(checkpoint);
  if (checkpoint != base_dir && resumes_adapter != lora.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--resume: checkpoint ", checkpoint,
                     resumes_adapter ? " holds LoRA adapters" : " holds full weights",
                     " but student.lora.rank is ", config.student.lora.rank,
                     "; resume with the student.lora the run was trained with"));
  }
  if (lora.has_value()) {
    // A resumed run's adapters, else student.lora.init's, else fresh ones.
    const std::string adapters = resumes_adapter ? checkpoint : config.student.lora.init;
    KAPPA_ASSIGN_OR_RETURN(start.student, LoadStudentWithAdapters(base_dir, *lora, adapters));
    if (!adapters.empty()) spdlog::info("LoRA adapters from {}", adapters);
    return start;
  }
  KAPPA_ASSIGN_OR_RETURN(start.student, base::CaptureExceptions(
                                            absl::StrCat("student checkpoint ", checkpoint),
                                            [&] { return model::LoadCheckpoint(checkpoint); },
                                            absl::StatusCode::kFailedPrecondition));
  return start;
}

constexpr const char* kExtraUsage =
    "  --run-dir DIR          run directory\n"
    "  --resume               continue from DIR's latest checkpoint\n"
    "  --world-size R         data-parallel ranks (default learner.world_size)\n"
    "  --rank N|auto          this rank; auto: the host name's trailing -N\n"
    "  --dist-store URL       tcp://HOST:PORT of rank 0 or file:///PATH (learner.dist_store)\n"
    "  --debug-nan-grad STEP[:TRIES]\n"
    "                         fault injection for tests: the first TRIES batches (default\n"
    "                         all) trained at STEP get a NaN gradient\n"
    "  --debug-bad-group STEP fault injection for tests: the first group taken for STEP\n"
    "                         gets a NaN reward after the wire checks (it is dropped)\n"
    "  --debug-step-throw STEP[:TRIES]\n"
    "                         fault injection for tests: the first TRIES steps tried at\n"
    "                         STEP (default all) throw inside the step\n";

std::string HostName() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

// What the learner needs before it serves, each part checked: a bad config,
// dataset, checkpoint, device or prompt stops the start with a status.
struct LearnerInputs {
  services::Config config;
  DataParallelSetup rank;
  std::string base_run_dir;  // rank 0's: the run's
  std::string run_dir;       // this rank's
  std::string address;       // to serve on
  std::unique_ptr<tasks::Dataset> train, heldout;
  StartPoint start;
  std::optional<PromptEncoder> prompts;
  std::vector<std::vector<int64_t>> train_prompts;  // ids of every train example
  int64_t vocab_limit = 0;                          // the ids distributions are over
  std::vector<int64_t> stop_token_ids;
  TeacherHead teacher_head;  // teacher.rows: hidden only
};

// The run directory: --run-dir, else runs_dir/name. Every rank
// checkpoints (so each resumes from its own state, in step with the
// others); ranks above 0 keep theirs under rank-N/ (RankRunDir) so the run
// directory holds them all. metrics.jsonl is rank 0's alone.
std::string BaseRunDir(const services::Config& config, const services::CommonFlags& flags) {
  const auto run_dir_flag = flags.extra.find("run-dir");
  return run_dir_flag == flags.extra.end() ? absl::StrCat(config.runs_dir, "/", config.name)
                                           : run_dir_flag->second;
}

// Moves the student to learner.device (this rank's GPU under data parallel).
absl::Status PlaceStudent(const services::Config& config, const DataParallelSetup& rank,
                          model::Decoder& student) {
  KAPPA_ASSIGN_OR_RETURN(torch::Device device,
                         services::ResolveDevice(config.learner.device, "learner.device"));
  if (device.is_cuda()) {
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(RankCudaIndex(
                                             config.learner.device, device.index(), rank,
                                             static_cast<int>(torch::cuda::device_count()))));
  }
  student->to(device);
  // Policy snapshots for publication are clones; only the trained model's
  // forward needs the recomputation.
  student->SetActivationCheckpointing(config.trainer.activation_checkpointing);
  spdlog::info("learner computes on {}{}", device.str(),
               config.trainer.activation_checkpointing ? " with activation checkpointing" : "");
  return absl::OkStatus();
}

// The student's tokenizer (its checkpoint's tokenizer.json; the character
// tokenizer for the toy models) and task.prompt_template turn examples into
// prompt ids; every prompt is encoded once here, so a template or tokenizer
// problem stops the start, naming the example. The teacher must share the
// tokenizer: distillation compares distributions id by id. The ids every
// distribution is over are the tokenizer's (padded embedding rows above them
// are never sampled or scored); the stop ids come from the student
// checkpoint (generation_config.json, else config.json).
absl::Status EncodePrompts(LearnerInputs& in) {
  const model::ModelConfig& student = in.start.student->config();
  KAPPA_ASSIGN_OR_RETURN(
      PromptEncoder prompts,
      PromptEncoder::ForRun(in.config, student.source_dir, services::TeacherModelDir(in.config)));
  KAPPA_ASSIGN_OR_RETURN(in.train_prompts, prompts.EncodeAll(*in.train, "train"));
  KAPPA_RETURN_IF_ERROR(prompts.EncodeAll(*in.heldout, "held-out").status());
  spdlog::info("prompts: {} ({} ids), task.prompt_template {}", prompts.tokenizer().source(),
               prompts.tokenizer().vocab_size(), in.config.task.prompt_template);
  KAPPA_RETURN_IF_ERROR(base::CaptureExceptions("student", [&] {
    in.vocab_limit = model::VocabLimit(student, prompts.tokenizer().vocab_size());
    in.stop_token_ids = model::StopTokenIds(student);
  }));
  in.prompts.emplace(std::move(prompts));
  return absl::OkStatus();
}

// teacher.rows: hidden: the teacher's output head, on the student's device
// in the dtype the teacher computes in there (teacher.dtype), over the
// tokenizer's ids. EncodePrompts has already refused a teacher whose
// tokenizer differs from the student's, naming both files.
absl::Status LoadTeacherHeadFor(LearnerInputs& in) {
  if (in.config.teacher.rows != services::TeacherRowsForm::kHidden) return absl::OkStatus();
  const torch::Device device = in.start.student->parameters().front().device();
  const std::string dir = services::TeacherModelDir(in.config);
  KAPPA_ASSIGN_OR_RETURN(in.teacher_head, LoadTeacherHead(dir, in.vocab_limit, device,
                                                          services::ResolveModelDtype(
                                                              in.config.teacher.dtype, device)));
  spdlog::info("teacher head from {}: {} rows x {} ({}, {}), frozen", dir, in.teacher_head.vocab(),
               in.teacher_head.hidden_size(), c10::toString(in.teacher_head.weight.scalar_type()),
               device.str());
  return absl::OkStatus();
}

absl::StatusOr<LearnerInputs> PrepareInputs(const services::CommonFlags& flags, bool resume) {
  LearnerInputs in;
  KAPPA_ASSIGN_OR_RETURN(in.config, services::LoadConfigFromFlags(flags));
  KAPPA_ASSIGN_OR_RETURN(in.rank, ResolveDataParallel(in.config, flags.extra, HostName()));
  if (in.config.trainer.groups_per_step > in.config.learner.buffer_groups) {
    // The buffer could never hold a whole batch: training would wait forever.
    return absl::InvalidArgumentError(
        absl::StrCat("trainer.groups_per_step (", in.config.trainer.groups_per_step,
                     ") exceeds learner.buffer_groups (", in.config.learner.buffer_groups, ")"));
  }
  services::ConfigureTorchThreads(in.config.learner.threads);
  torch::manual_seed(in.config.seed);
  in.base_run_dir = BaseRunDir(in.config, flags);
  in.run_dir = RankRunDir(in.base_run_dir, in.rank.rank);
  in.address = flags.address.empty() ? in.config.learner.address : flags.address;
  std::filesystem::create_directories(in.run_dir);
  KAPPA_ASSIGN_OR_RETURN(in.train, tasks::MakeDataset(in.config, tasks::Split::kTrain));
  KAPPA_ASSIGN_OR_RETURN(in.heldout, tasks::MakeDataset(in.config, tasks::Split::kHeldOut));
  KAPPA_ASSIGN_OR_RETURN(
      in.start, LoadStartPoint(in.config, in.base_run_dir, in.rank, in.train->size(), resume));
  KAPPA_RETURN_IF_ERROR(PlaceStudent(in.config, in.rank, in.start.student));
  KAPPA_RETURN_IF_ERROR(EncodePrompts(in));
  KAPPA_RETURN_IF_ERROR(LoadTeacherHeadFor(in));
  return in;
}

// What every work item asks of the workers, from the config and the student.
WorkTemplate WorkFor(const LearnerInputs& in) {
  WorkTemplate work = WorkTemplateFor(in.config);
  work.vocab_limit = static_cast<int32_t>(in.vocab_limit);
  work.stop_token_ids.assign(in.stop_token_ids.begin(), in.stop_token_ids.end());
  spdlog::info(
      "work items: G={} max_new_tokens={} teacher_form={} teacher_demonstrations={} "
      "vocab_limit={} stop ids [{}] stop strings {}",
      work.group_size, work.max_new_tokens, work.teacher_form, work.teacher_demonstrations,
      work.vocab_limit, absl::StrJoin(work.stop_token_ids, ", "), work.stop_strings.size());
  return work;
}

// A fault-injection flag's STEP[:TRIES] (TRIES default: every try); nullopt
// when `name` was not given. INVALID_ARGUMENT naming the flag otherwise.
struct FaultAt {
  int64_t step = 0;
  int64_t tries = std::numeric_limits<int64_t>::max();
};
absl::StatusOr<std::optional<FaultAt>> FaultFlag(const services::CommonFlags& flags,
                                                 const std::string& name, bool takes_tries) {
  const auto flag = flags.extra.find(name);
  if (flag == flags.extra.end()) return std::optional<FaultAt>();
  const std::vector<std::string> parts = absl::StrSplit(flag->second, ':');
  FaultAt at;
  if (parts.size() > (takes_tries ? 2u : 1u) || !absl::SimpleAtoi(parts[0], &at.step) ||
      at.step < 1 ||
      (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &at.tries) || at.tries < 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", flag->second, "' is not ",
                     takes_tries ? "STEP[:TRIES] with STEP, TRIES >= 1" : "a STEP >= 1"));
  }
  spdlog::warn("fault injection: --{} {}", name, flag->second);
  return std::optional<FaultAt>(at);
}

// The test-only faults (docs/reliability.md): --debug-nan-grad STEP[:TRIES]
// (TrainerLoop::InjectNanGradient), --debug-step-throw STEP[:TRIES]
// (InjectStepThrow), --debug-bad-group STEP (InjectBadGroup).
absl::Status ApplyFaultInjection(const services::CommonFlags& flags, TrainerLoop& trainer) {
  KAPPA_ASSIGN_OR_RETURN(std::optional<FaultAt> nan, FaultFlag(flags, "debug-nan-grad", true));
  if (nan) trainer.InjectNanGradient(nan->step, nan->tries);
  KAPPA_ASSIGN_OR_RETURN(std::optional<FaultAt> thrown, FaultFlag(flags, "debug-step-throw", true));
  if (thrown) trainer.InjectStepThrow(thrown->step, thrown->tries);
  KAPPA_ASSIGN_OR_RETURN(std::optional<FaultAt> bad, FaultFlag(flags, "debug-bad-group", false));
  if (bad) trainer.InjectBadGroup(bad->step);
  return absl::OkStatus();
}

// What serves the workers while the trainer runs, in the order it starts;
// Stop() ends it in the order that drains it.
struct Serving {
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<PolicyPublisher> publisher;
  std::unique_ptr<LearnerService> service;
  std::unique_ptr<WeightBroadcaster> broadcaster;  // null without a weight group
  std::unique_ptr<services::GrpcServer> server;

  void Stop() {
    service->Shutdown();
    coordinator->Shutdown();
    if (broadcaster != nullptr) broadcaster->Stop();
    publisher->Shutdown();
    server->Shutdown(absl::Seconds(2));
  }
};

// The optimizer over the student, with the rate schedule, its state split
// over the ranks under learner.shard, restored from the checkpoint's
// optimizer state on a resume.
absl::StatusOr<std::unique_ptr<PolicyOptimizer>> MakeOptimizer(const services::Config& config,
                                                               const DataParallelSetup& rank,
                                                               const StartPoint& start) {
  KAPPA_ASSIGN_OR_RETURN(LearningRateSchedule schedule, MakeLearningRateSchedule(config));
  auto optimizer = std::make_unique<PolicyOptimizer>(
      start.student, schedule, config.trainer.weight_decay, config.trainer.max_grad_norm);
  if (config.learner.shard != services::LearnerShard::kNone) {
    const bool gradients = config.learner.shard == services::LearnerShard::kGradients;
    optimizer->ShardState(gradients ? ShardStage::kGradients : ShardStage::kOptimizer, rank.rank,
                          rank.world_size);
    const ShardRange shard = *optimizer->optimizer_shard();
    spdlog::info("learner.shard: {}: rank {} of {} holds AdamW's state{} of elements {}..{} of {}",
                 services::ChoiceName(config.learner.shard), rank.rank, rank.world_size,
                 gradients ? " and the summed gradients" : "", shard.begin, shard.end, shard.total);
  }
  const std::vector<std::string>& paths = start.optimizer_paths;
  if (paths.size() == 1) {
    KAPPA_RETURN_IF_ERROR(
        base::CaptureExceptions(paths.front(), [&] { optimizer->Load(paths.front()); }));
  } else if (paths.size() > 1) {
    KAPPA_RETURN_IF_ERROR(
        base::CaptureExceptions(absl::StrCat("the optimizer state of ", paths.size(), " ranks"),
                                [&] { optimizer->LoadResharded(paths); }));
  }
  return optimizer;
}

// Starts the coordinator (requeueing what was in flight at the checkpoint,
// before any worker can lease), the publisher, the Learner service, the
// same-host weight group (learner.weight_group_workers; rank 0 publishes)
// and the gRPC server. Errors: ConfigurationError for a bad weight-group or
// server setting; the server's own status when it cannot bind.
absl::StatusOr<Serving> StartServing(const LearnerInputs& in) {
  const services::Config& config = in.config;
  Serving serving;
  CoordinatorOptions coordinator_options;
  coordinator_options.buffer_groups = config.learner.buffer_groups;
  coordinator_options.max_staleness = config.learner.max_staleness;
  coordinator_options.lease_timeout = absl::Milliseconds(config.learner.lease_timeout_ms);
  coordinator_options.rank = in.rank.rank;
  coordinator_options.world_size = in.rank.world_size;
  serving.coordinator = std::make_unique<Coordinator>(
      in.train->size(), config.seed, in.start.state.data_position, coordinator_options);
  const std::vector<int64_t>& pending = in.start.state.pending_prompts;
  serving.coordinator->Requeue(std::vector<size_t>(pending.begin(), pending.end()));
  // rollout.weight_delta: keep each version's encodings as the next one's
  // delta base (learner/policy_publisher.h).
  PublisherOptions publisher_options;
  // With LoRA the frozen weights are unchanged ranges of every delta: a
  // version then carries only the adapters' bytes.
  publisher_options.keep_delta_bases = config.rollout.weight_delta || config.student.lora.rank > 0;
  serving.publisher = std::make_unique<PolicyPublisher>(publisher_options);
  const WorkTemplate work = WorkFor(in);
  GroupExpectations expectations = GroupExpectationsFor(work, in.vocab_limit);
  if (in.teacher_head.defined()) expectations.teacher_hidden_size = in.teacher_head.hidden_size();
  expectations.max_positions = in.start.student->config().max_position_embeddings;
  serving.service = std::make_unique<LearnerService>(
      *in.train,
      [&in](size_t example_index) {
        const std::vector<int64_t>& ids = in.train_prompts[example_index];
        return std::vector<int32_t>(ids.begin(), ids.end());
      },
      work, expectations, serving.coordinator.get(), serving.publisher.get());

  absl::StatusOr<std::optional<WeightBroadcastOptions>> group =
      WeightBroadcastOptionsFromConfig(config, in.start.student->parameters().front().device());
  if (!group.ok()) return services::ConfigurationError(group.status());
  if (group->has_value() && in.rank.primary()) {
    serving.broadcaster = std::make_unique<WeightBroadcaster>(serving.publisher.get(), **group);
    serving.service->set_weight_broadcaster(serving.broadcaster.get());
    if (absl::Status started = serving.broadcaster->Start(); !started.ok()) return started;
  }
  absl::StatusOr<services::ServerOptions> server_options =
      services::ServerOptionsFromConfig(config);
  if (!server_options.ok()) return services::ConfigurationError(server_options.status());
  absl::StatusOr<std::unique_ptr<services::GrpcServer>> server =
      services::GrpcServer::Start(in.address, {serving.service.get()}, *server_options);
  if (!server.ok()) {
    return absl::Status(server.status().code(), absl::StrCat("cannot serve on ", in.address, ": ",
                                                             server.status().message()));
  }
  serving.server = *std::move(server);
  spdlog::info("learner serving on {} ({}; run dir {})", in.address,
               services::DescribeTransport(server_options->security), in.run_dir);
  return serving;
}

// The trainer (TrainerLoop::Create checks its settings), with what it
// reports besides: the --debug-nan-grad fault, the corrupted subset of
// teacher/student.bootstrap.corrupt, the conflict atlas (rank 0).
absl::StatusOr<std::unique_ptr<TrainerLoop>> MakeTrainer(
    const services::CommonFlags& flags, LearnerInputs& in, Serving& serving,
    std::unique_ptr<PolicyOptimizer> optimizer) {
  const services::Config& config = in.config;
  KAPPA_ASSIGN_OR_RETURN(
      std::unique_ptr<TrainerLoop> trainer,
      TrainerLoop::Create(config, in.run_dir, in.start.student, std::move(optimizer),
                          in.start.state, serving.coordinator.get(), serving.publisher.get(),
                          *in.heldout, *in.prompts, in.vocab_limit, in.rank));
  KAPPA_RETURN_IF_ERROR(ApplyFaultInjection(flags, *trainer));
  trainer->set_teacher_head(in.teacher_head);
  KAPPA_ASSIGN_OR_RETURN(std::optional<tasks::AnswerCorruption> corruption,
                         StudiedCorruption(config));
  const CorruptedSubset* subset = nullptr;  // owned by `trainer`
  if (corruption.has_value()) {
    auto owned = std::make_unique<CorruptedSubset>(
        *corruption, *in.train, *in.heldout,
        static_cast<size_t>(std::max<int64_t>(config.trainer.eval_examples, 0)));
    subset = owned.get();
    trainer->set_corrupted_subset(std::move(owned));
  }
  if (config.monitor.atlas_positions > 0 && in.rank.primary()) {
    KAPPA_RETURN_IF_ERROR(base::CaptureExceptions("conflict atlas", [&] {
      trainer->set_conflict_atlas(std::make_unique<ConflictAtlas>(
          in.run_dir + "/conflict_atlas.jsonl", config.monitor.atlas_positions, *in.train,
          in.prompts->tokenizer(), subset));
    }));
  }
  return trainer;
}

// What a scrape reads besides the trainer's steps: the coordinator's,
// service's and weight group's counters, at collect time.
void CollectServingCounters(const Serving& serving, LearnerMetrics& metrics) {
  metrics.RecordCoordinator(serving.coordinator->counters());
  const ServiceCounters& c = serving.service->counters();
  metrics.RecordInvalidGroups(c.groups_invalid.load());
  metrics.RecordRefusedGroups({c.refused_malformed.load(), c.refused_positions.load(),
                               c.refused_prompt.load(), c.refused_policy_version.load()});
  LearnerMetrics::PolicyTraffic traffic{
      c.policy_versions_full.load(),     c.policy_versions_delta.load(),
      c.policy_bytes_full.load(),        c.policy_bytes_delta.load(),
      c.policy_bytes_saved_delta.load(), c.policy_bytes_saved_bfloat16.load()};
  if (serving.broadcaster != nullptr) {
    const WeightBroadcastCounters& group = serving.broadcaster->counters();
    traffic.group_versions = group.versions.load();
    traffic.group_bytes = group.bytes.load();
    traffic.group_seconds = static_cast<double>(group.microseconds.load()) / 1e6;
  }
  metrics.RecordPolicyTraffic(traffic);
}

// The learner process: load and check every input, serve the workers,
// train until trainer.steps or a termination signal, stop the serving
// half, report. Configuration errors are marked (exit code 2); a training
// failure is not (1); a signal is OK.
absl::Status Serve(const services::CommonFlags& flags, bool resume) {
  services::InitLogging("learner", flags.log_file);
  absl::StatusOr<LearnerInputs> in = PrepareInputs(flags, resume);
  if (!in.ok()) return services::ConfigurationError(in.status());
  absl::StatusOr<std::unique_ptr<PolicyOptimizer>> optimizer =
      MakeOptimizer(in->config, in->rank, in->start);
  if (!optimizer.ok()) return services::ConfigurationError(optimizer.status());
  // Data parallel: meet the other ranks and start from rank 0's weights. A
  // resumed rank has loaded its own checkpoint (optimizer state included),
  // written at the same step as the others': the ranks' updates are
  // identical, so the states are too.
  KAPPA_ASSIGN_OR_RETURN(std::unique_ptr<dist::Collectives> collectives,
                         JoinDataParallel(in->rank, in->start.state.step, **optimizer));
  KAPPA_ASSIGN_OR_RETURN(Serving serving, StartServing(*in));
  absl::StatusOr<std::unique_ptr<TrainerLoop>> trainer =
      MakeTrainer(flags, *in, serving, *std::move(optimizer));
  if (!trainer.ok()) return services::ConfigurationError(trainer.status());

  // One registry for the process; /metrics only when asked for.
  services::metrics::Registry registry;
  LearnerMetrics learner_metrics(registry);
  registry.AddCollectHook([&] { CollectServingCounters(serving, learner_metrics); });
  (*trainer)->set_metrics(&learner_metrics);
  KAPPA_ASSIGN_OR_RETURN(
      std::unique_ptr<services::metrics::MetricsServer> metrics_server,
      services::metrics::ServeMetricsIfRequested(flags.metrics_address, &registry));
  KAPPA_RETURN_IF_ERROR(services::WriteReadyFile(
      flags.ready_file, {getpid(), services::WithPort(in->address, serving.server->port()),
                         services::metrics::BoundAddress(metrics_server.get())}));

  const absl::Status status = (*trainer)->Run([] { return services::TerminationRequested(); });
  serving.Stop();
  if (status.ok()) {
    spdlog::info("training finished");
    return absl::OkStatus();
  }
  if (absl::IsCancelled(status)) {
    spdlog::info("stopped by signal");
    return absl::OkStatus();
  }
  return absl::Status(status.code(), absl::StrCat("training failed: ", status.message()));
}

// argv without --resume (the one boolean flag, which the shared parser does
// not know); *resume says whether it was there.
std::vector<char*> WithoutResumeFlag(int argc, char** argv, bool* resume) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--resume") {
      *resume = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  return args;
}

}  // namespace
}  // namespace kappa::learner

int main(int argc, char** argv) {
  bool resume = false;
  std::vector<char*> args = kappa::learner::WithoutResumeFlag(argc, argv, &resume);
  return kappa::services::ServiceMain(static_cast<int>(args.size()), args.data(),
                                      {"kappa-learner",
                                       kappa::learner::kExtraUsage,
                                       {"run-dir", "rank", "world-size", "dist-store",
                                        "debug-nan-grad", "debug-bad-group", "debug-step-throw"},
                                       [resume](const kappa::services::CommonFlags& flags) {
                                         return kappa::learner::Serve(flags, resume);
                                       }});
}
