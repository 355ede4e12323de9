// kappa-learner: the coordinator and trainer process.
//
//   kappa-learner --config FILE [key=value ...] [--run-dir DIR] [--resume]
//                 [--log-file FILE] [--address HOST:PORT] [--metrics-address HOST:PORT]
//                 [--world-size R --rank N|auto --dist-store URL]
//                 [--debug-nan-grad STEP[:TRIES]]
//   kappa-learner --health-check HOST:PORT
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
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
#include "learner/coordinator.h"
#include "learner/data_parallel_setup.h"
#include "learner/learner_metrics.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/prompt_encoder.h"
#include "learner/run_state.h"
#include "learner/step_config.h"
#include "learner/trainer_loop.h"
#include "learner/work_config.h"
#include "model/checkpoint.h"
#include "model/generation_config.h"
#include "services/cli_flags.h"
#include "services/config.h"
#include "services/logging.h"
#include "services/metrics.h"
#include "services/metrics_server.h"
#include "services/ready_file.h"
#include "services/server.h"
#include "services/torch_runtime.h"
#include "tasks/from_config.h"

namespace kappa::learner {
namespace {

struct StartPoint {
  model::Decoder student{nullptr};
  TrainerState state;
  std::string optimizer_path;  // empty: fresh optimizer
};

absl::StatusOr<StartPoint> LoadStartPoint(const services::Config& config,
                                          const std::string& run_dir, bool resume) {
  StartPoint start;
  start.state.seed = services::RlSeed(config);
  std::string checkpoint = services::StudentModelDir(config);
  if (resume) {
    KAPPA_ASSIGN_OR_RETURN(std::optional<std::string> latest, FindLatest(run_dir));
    if (latest.has_value()) {
      checkpoint = *latest;
      KAPPA_ASSIGN_OR_RETURN(start.state, ReadTrainerState(checkpoint));
      start.optimizer_path = checkpoint + "/optimizer.pt";
      spdlog::info("resuming from {} (step {})", checkpoint, start.state.step);
    } else {
      spdlog::info("--resume: no checkpoint in {}, starting fresh", run_dir);
    }
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
    "                         all) trained at STEP get a NaN gradient\n";

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
  std::string run_dir;  // this rank's
  std::string address;  // to serve on
  std::unique_ptr<tasks::Dataset> train, heldout;
  StartPoint start;
  std::optional<PromptEncoder> prompts;
  std::vector<std::vector<int64_t>> train_prompts;  // ids of every train example
  int64_t vocab_limit = 0;                          // the ids distributions are over
  std::vector<int64_t> stop_token_ids;
};

// Every rank checkpoints (so each resumes from its own state, in step with
// the others); ranks above 0 keep theirs under rank-N/ so a shared run
// directory holds them all. metrics.jsonl is rank 0's alone.
std::string RankRunDir(const services::Config& config, const services::CommonFlags& flags,
                       const DataParallelSetup& rank) {
  const auto run_dir_flag = flags.extra.find("run-dir");
  const std::string base = run_dir_flag == flags.extra.end()
                               ? absl::StrCat(config.runs_dir, "/", config.name)
                               : run_dir_flag->second;
  return rank.primary() ? base : absl::StrCat(base, "/rank-", rank.rank);
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
  in.run_dir = RankRunDir(in.config, flags, in.rank);
  in.address = flags.address.empty() ? in.config.learner.address : flags.address;
  std::filesystem::create_directories(in.run_dir);
  KAPPA_ASSIGN_OR_RETURN(in.train, tasks::MakeDataset(in.config, tasks::Split::kTrain));
  KAPPA_ASSIGN_OR_RETURN(in.heldout, tasks::MakeDataset(in.config, tasks::Split::kHeldOut));
  KAPPA_ASSIGN_OR_RETURN(in.start, LoadStartPoint(in.config, in.run_dir, resume));
  KAPPA_RETURN_IF_ERROR(PlaceStudent(in.config, in.rank, in.start.student));
  KAPPA_RETURN_IF_ERROR(EncodePrompts(in));
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

// --debug-nan-grad STEP[:TRIES] (docs/reliability.md): TrainerLoop::InjectNanGradient.
absl::Status ApplyNanGradientFault(const services::CommonFlags& flags, TrainerLoop& trainer) {
  const auto flag = flags.extra.find("debug-nan-grad");
  if (flag == flags.extra.end()) return absl::OkStatus();
  const std::vector<std::string> parts = absl::StrSplit(flag->second, ':');
  int64_t step = 0, tries = std::numeric_limits<int64_t>::max();
  if (parts.size() > 2 || !absl::SimpleAtoi(parts[0], &step) || step < 1 ||
      (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &tries) || tries < 1))) {
    return absl::InvalidArgumentError(absl::StrCat("--debug-nan-grad: '", flag->second,
                                                   "' is not STEP[:TRIES] with STEP, TRIES >= 1"));
  }
  spdlog::warn("fault injection: NaN gradients at step {} (--debug-nan-grad {})", step,
               flag->second);
  trainer.InjectNanGradient(step, tries);
  return absl::OkStatus();
}

// The command line: --resume is the one boolean flag; the shared parser
// handles the rest. Returns the exit code when there is nothing to train
// (usage, --help, --health-check).
std::optional<int> ParseFlags(int argc, char** argv, services::CommonFlags* flags, bool* resume) {
  std::vector<const char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--resume") {
      *resume = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  absl::StatusOr<services::CommonFlags> parsed =
      services::ParseCommonFlags(static_cast<int>(args.size()), args.data(),
                                 {"run-dir", "rank", "world-size", "dist-store", "debug-nan-grad"});
  if (!parsed.ok()) {
    std::cerr << "kappa-learner: " << parsed.status().message() << "\n"
              << services::Usage("kappa-learner", kExtraUsage);
    return 2;
  }
  if (parsed->help) {
    std::cout << services::Usage("kappa-learner", kExtraUsage);
    return 0;
  }
  *flags = *std::move(parsed);
  services::InitLogging("learner", flags->log_file);
  if (!flags->health_check_address.empty()) return services::RunHealthCheck(*flags);
  return std::nullopt;
}

int Main(int argc, char** argv) {
  services::InstallTerminationHandlers();
  services::CommonFlags flags;
  bool resume = false;
  if (std::optional<int> exit_code = ParseFlags(argc, argv, &flags, &resume)) return *exit_code;

  absl::StatusOr<LearnerInputs> in = PrepareInputs(flags, resume);
  if (!in.ok()) {
    spdlog::error("{}", std::string(in.status().message()));
    return 2;
  }
  const services::Config& config = in->config;
  StartPoint& start = in->start;
  absl::StatusOr<LearningRateSchedule> schedule = MakeLearningRateSchedule(config);
  if (!schedule.ok()) {
    spdlog::error("{}", std::string(schedule.status().message()));
    return 2;
  }
  auto optimizer = std::make_unique<PolicyOptimizer>(
      start.student, *schedule, config.trainer.weight_decay, config.trainer.max_grad_norm);
  if (!start.optimizer_path.empty()) {
    if (absl::Status loaded = base::CaptureExceptions(
            start.optimizer_path, [&] { optimizer->Load(start.optimizer_path); });
        !loaded.ok()) {
      spdlog::error("{}", std::string(loaded.message()));
      return 2;
    }
  }
  // Data parallel: meet the other ranks and start from rank 0's weights. A
  // resumed rank has loaded its own checkpoint (optimizer state included),
  // written at the same step as the others': the ranks' updates are
  // identical, so the states are too.
  absl::StatusOr<std::unique_ptr<dist::Collectives>> collectives =
      JoinDataParallel(in->rank, start.state.step, *optimizer);
  if (!collectives.ok()) {
    spdlog::error("{}", std::string(collectives.status().message()));
    return 1;
  }

  CoordinatorOptions coordinator_options;
  coordinator_options.buffer_groups = config.learner.buffer_groups;
  coordinator_options.max_staleness = config.learner.max_staleness;
  coordinator_options.lease_timeout = absl::Milliseconds(config.learner.lease_timeout_ms);
  coordinator_options.rank = in->rank.rank;
  coordinator_options.world_size = in->rank.world_size;
  Coordinator coordinator(in->train->size(), config.seed, start.state.data_position,
                          coordinator_options);
  // A resumed run first trains on what was in flight at its checkpoint (the
  // prompt source continues after the last prompt drawn). Before the server
  // starts, so no worker can lease a new prompt ahead of them.
  coordinator.Requeue(
      std::vector<size_t>(start.state.pending_prompts.begin(), start.state.pending_prompts.end()));
  // rollout.weight_delta: keep each version's encodings as the next one's
  // delta base (learner/policy_publisher.h).
  PublisherOptions publisher_options;
  publisher_options.keep_delta_bases = config.rollout.weight_delta;
  PolicyPublisher publisher(publisher_options);
  const WorkTemplate work = WorkFor(*in);
  LearnerService service(
      *in->train,
      [&in](size_t example_index) {
        const std::vector<int64_t>& ids = in->train_prompts[example_index];
        return std::vector<int32_t>(ids.begin(), ids.end());
      },
      work, GroupExpectationsFor(work, in->vocab_limit), &coordinator, &publisher);

  // learner.weight_group_workers: same-host workers get every version in
  // one c10d broadcast (learner/weight_broadcaster.h); rank 0 publishes.
  absl::StatusOr<std::optional<WeightBroadcastOptions>> group_options =
      WeightBroadcastOptionsFromConfig(config, start.student->parameters().front().device());
  if (!group_options.ok()) {
    spdlog::error("configuration: {}", std::string(group_options.status().message()));
    return 2;
  }
  std::unique_ptr<WeightBroadcaster> broadcaster;
  if (group_options->has_value() && in->rank.primary()) {
    broadcaster = std::make_unique<WeightBroadcaster>(&publisher, **group_options);
    service.set_weight_broadcaster(broadcaster.get());
    broadcaster->Start();
  }

  absl::StatusOr<services::ServerOptions> server_options =
      services::ServerOptionsFromConfig(config);
  if (!server_options.ok()) {
    spdlog::error("{}", server_options.status().ToString());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<services::GrpcServer>> server =
      services::GrpcServer::Start(in->address, {&service}, *server_options);
  if (!server.ok()) {
    spdlog::error("cannot serve on {}: {}", in->address, server.status().ToString());
    return 1;
  }
  spdlog::info("learner serving on {} ({}; run dir {})", in->address,
               services::DescribeTransport(server_options->security), in->run_dir);

  absl::StatusOr<std::unique_ptr<TrainerLoop>> created = TrainerLoop::Create(
      config, in->run_dir, start.student, std::move(optimizer), start.state, &coordinator,
      &publisher, *in->heldout, *in->prompts, in->vocab_limit, in->rank);
  if (!created.ok()) {
    spdlog::error("{}", created.status().ToString());
    return 2;
  }
  TrainerLoop& trainer = **created;
  if (absl::Status fault = ApplyNanGradientFault(flags, trainer); !fault.ok()) {
    spdlog::error("{}", std::string(fault.message()));
    return 2;
  }
  absl::StatusOr<std::optional<tasks::AnswerCorruption>> corruption = StudiedCorruption(config);
  if (!corruption.ok()) {
    spdlog::error("{}", std::string(corruption.status().message()));
    return 2;
  }
  const CorruptedSubset* subset = nullptr;  // owned by `trainer`
  if (corruption->has_value()) {
    auto owned = std::make_unique<CorruptedSubset>(
        **corruption, *in->train, *in->heldout,
        static_cast<size_t>(std::max<int64_t>(config.trainer.eval_examples, 0)));
    subset = owned.get();
    trainer.set_corrupted_subset(std::move(owned));
  }
  if (config.monitor.atlas_positions > 0 && in->rank.primary()) {
    if (absl::Status opened = base::CaptureExceptions(
            "conflict atlas",
            [&] {
              trainer.set_conflict_atlas(std::make_unique<ConflictAtlas>(
                  in->run_dir + "/conflict_atlas.jsonl", config.monitor.atlas_positions, *in->train,
                  in->prompts->tokenizer(), subset));
            });
        !opened.ok()) {
      spdlog::error("{}", std::string(opened.message()));
      return 2;
    }
  }
  // One registry for the process; /metrics only when asked for.
  services::metrics::Registry registry;
  LearnerMetrics learner_metrics(registry);
  registry.AddCollectHook([&] {
    learner_metrics.RecordCoordinator(coordinator.counters());
    learner_metrics.RecordInvalidGroups(service.counters().groups_invalid.load());
    const ServiceCounters& c = service.counters();
    LearnerMetrics::PolicyTraffic traffic{
        c.policy_versions_full.load(),     c.policy_versions_delta.load(),
        c.policy_bytes_full.load(),        c.policy_bytes_delta.load(),
        c.policy_bytes_saved_delta.load(), c.policy_bytes_saved_bfloat16.load()};
    if (broadcaster != nullptr) {
      const WeightBroadcastCounters& group = broadcaster->counters();
      traffic.group_versions = group.versions.load();
      traffic.group_bytes = group.bytes.load();
      traffic.group_seconds = static_cast<double>(group.microseconds.load()) / 1e6;
    }
    learner_metrics.RecordPolicyTraffic(traffic);
  });
  trainer.set_metrics(&learner_metrics);
  absl::StatusOr<std::unique_ptr<services::metrics::MetricsServer>> metrics_server =
      services::metrics::ServeMetricsIfRequested(flags.metrics_address, &registry);
  if (!metrics_server.ok()) {
    spdlog::error("{}", metrics_server.status().ToString());
    return 1;
  }
  if (absl::Status ready = services::WriteReadyFile(
          flags.ready_file, {getpid(), services::WithPort(in->address, (*server)->port()),
                             services::metrics::BoundAddress(metrics_server->get())});
      !ready.ok()) {
    spdlog::error("{}", ready.ToString());
    return 1;
  }
  absl::Status status = trainer.Run([] { return services::TerminationRequested(); });

  service.Shutdown();
  coordinator.Shutdown();
  if (broadcaster != nullptr) broadcaster->Stop();
  publisher.Shutdown();
  (*server)->Shutdown(absl::Seconds(2));
  if (status.ok()) {
    spdlog::info("training finished");
    return 0;
  }
  if (absl::IsCancelled(status)) {
    spdlog::info("stopped by signal");
    return 0;
  }
  spdlog::error("training failed: {}", status.ToString());
  return 1;
}

}  // namespace
}  // namespace kappa::learner

int main(int argc, char** argv) { return kappa::learner::Main(argc, argv); }
