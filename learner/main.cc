// kappa-learner: the coordinator and trainer process.
//
//   kappa-learner --config FILE [key=value ...] [--run-dir DIR] [--resume]
//                 [--log-file FILE] [--address HOST:PORT] [--metrics-address HOST:PORT]
//                 [--world-size R --rank N|auto --dist-store URL]
//   kappa-learner --health-check HOST:PORT
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "learner/algo/collectives.h"
#include "learner/algo/optimizer_step.h"
#include "learner/coordinator.h"
#include "learner/data_parallel_setup.h"
#include "learner/learner_metrics.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/prompt_encoder.h"
#include "learner/run_state.h"
#include "learner/trainer_loop.h"
#include "learner/work_config.h"
#include "model/checkpoint.h"
#include "model/generation_config.h"
#include "services/cli_flags.h"
#include "services/config.h"
#include "services/logging.h"
#include "services/metrics.h"
#include "services/metrics_server.h"
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
    absl::StatusOr<std::optional<std::string>> latest = FindLatest(run_dir);
    if (!latest.ok()) return latest.status();
    if (latest->has_value()) {
      checkpoint = **latest;
      absl::StatusOr<TrainerState> state = ReadTrainerState(checkpoint);
      if (!state.ok()) return state.status();
      start.state = *state;
      start.optimizer_path = checkpoint + "/optimizer.pt";
      spdlog::info("resuming from {} (step {})", checkpoint, start.state.step);
    } else {
      spdlog::info("--resume: no checkpoint in {}, starting fresh", run_dir);
    }
  }
  try {
    start.student = model::LoadCheckpoint(checkpoint);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("student checkpoint ", checkpoint, ": ", e.what()));
  }
  return start;
}

constexpr const char* kExtraUsage =
    "  --run-dir DIR          run directory\n"
    "  --resume               continue from DIR's latest checkpoint\n"
    "  --world-size R         data-parallel ranks (default learner.world_size)\n"
    "  --rank N|auto          this rank; auto: the host name's trailing -N\n"
    "  --dist-store URL       tcp://HOST:PORT of rank 0 or file:///PATH (learner.dist_store)\n";

std::string HostName() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

int Main(int argc, char** argv) {
  services::InstallTerminationHandlers();
  // --resume is the one boolean flag; the shared parser handles the rest.
  bool resume = false;
  std::vector<const char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--resume") {
      resume = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  absl::StatusOr<services::CommonFlags> flags =
      services::ParseCommonFlags(static_cast<int>(args.size()), args.data(),
                                 {"run-dir", "rank", "world-size", "dist-store"});
  if (!flags.ok()) {
    std::cerr << "kappa-learner: " << flags.status().message() << "\n"
              << services::Usage("kappa-learner", kExtraUsage);
    return 2;
  }
  if (flags->help) {
    std::cout << services::Usage("kappa-learner", kExtraUsage);
    return 0;
  }
  services::InitLogging("learner", flags->log_file);
  if (!flags->health_check_address.empty()) {
    return services::RunHealthCheck(*flags);
  }

  absl::StatusOr<services::Config> config = services::LoadConfigFromFlags(*flags);
  if (!config.ok()) {
    spdlog::error("{}", config.status().ToString());
    return 2;
  }
  absl::StatusOr<DataParallelSetup> rank = ResolveDataParallel(*config, flags->extra, HostName());
  if (!rank.ok()) {
    spdlog::error("{}", std::string(rank.status().message()));
    return 2;
  }
  if (config->trainer.groups_per_step > config->learner.buffer_groups) {
    // The buffer could never hold a whole batch: training would wait forever.
    spdlog::error("trainer.groups_per_step ({}) exceeds learner.buffer_groups ({})",
                  config->trainer.groups_per_step, config->learner.buffer_groups);
    return 2;
  }
  services::ConfigureTorchThreads(config->learner.threads);
  torch::manual_seed(config->seed);
  const auto run_dir_flag = flags->extra.find("run-dir");
  const std::string base_run_dir = run_dir_flag == flags->extra.end()
                                       ? absl::StrCat(config->runs_dir, "/", config->name)
                                       : run_dir_flag->second;
  // Every rank checkpoints (so each resumes from its own state, in step with
  // the others); ranks above 0 keep theirs under rank-N/ so a shared run
  // directory holds them all. metrics.jsonl is rank 0's alone.
  const std::string run_dir =
      rank->primary() ? base_run_dir : absl::StrCat(base_run_dir, "/rank-", rank->rank);
  const std::string address = flags->address.empty() ? config->learner.address : flags->address;
  std::filesystem::create_directories(run_dir);

  auto train = tasks::MakeDataset(*config, tasks::Split::kTrain);
  auto heldout = tasks::MakeDataset(*config, tasks::Split::kHeldOut);
  if (!train.ok() || !heldout.ok()) {
    spdlog::error("dataset: {}", (!train.ok() ? train : heldout).status().ToString());
    return 2;
  }
  absl::StatusOr<StartPoint> start = LoadStartPoint(*config, run_dir, resume);
  if (!start.ok()) {
    spdlog::error("{}", start.status().ToString());
    return 2;
  }
  absl::StatusOr<torch::Device> device =
      services::ResolveDevice(config->learner.device, "learner.device");
  if (!device.ok()) {
    spdlog::error("{}", device.status().ToString());
    return 2;
  }
  if (device->is_cuda()) {
    device = torch::Device(
        torch::kCUDA, static_cast<c10::DeviceIndex>(RankCudaIndex(
                          config->learner.device, device->index(), *rank,
                          static_cast<int>(torch::cuda::device_count()))));
  }
  start->student->to(*device);
  spdlog::info("learner computes on {}", device->str());
  // The student's tokenizer (its checkpoint's tokenizer.json; the character
  // tokenizer for the toy models) and task.prompt_template turn examples into
  // prompt ids; every prompt is encoded once here, so a template or tokenizer
  // problem stops the start, naming the example. The teacher must share the
  // tokenizer: distillation compares distributions id by id.
  absl::StatusOr<PromptEncoder> prompts = PromptEncoder::ForRun(
      *config, start->student->config().source_dir, services::TeacherModelDir(*config));
  if (!prompts.ok()) {
    spdlog::error("{}", std::string(prompts.status().message()));
    return 2;
  }
  absl::StatusOr<std::vector<std::vector<int64_t>>> train_prompts =
      prompts->EncodeAll(**train, "train");
  absl::Status heldout_prompts = prompts->EncodeAll(**heldout, "held-out").status();
  if (!train_prompts.ok() || !heldout_prompts.ok()) {
    spdlog::error(
        "{}",
        std::string((!train_prompts.ok() ? train_prompts.status() : heldout_prompts).message()));
    return 2;
  }
  spdlog::info("prompts: {} ({} ids), task.prompt_template {}", prompts->tokenizer().source(),
               prompts->tokenizer().vocab_size(), config->task.prompt_template);
  // The ids every distribution is over: the tokenizer's (padded embedding
  // rows above them are never sampled or scored). The stop ids come from the
  // student checkpoint (generation_config.json, else config.json).
  int64_t vocab_limit = 0;
  std::vector<int64_t> stop_token_ids;
  try {
    vocab_limit = model::VocabLimit(start->student->config(), prompts->tokenizer().vocab_size());
    stop_token_ids = model::StopTokenIds(start->student->config());
  } catch (const std::exception& e) {
    spdlog::error("student: {}", e.what());
    return 2;
  }

  auto optimizer = std::make_unique<PolicyOptimizer>(
      start->student, config->trainer.lr, config->trainer.weight_decay,
      config->trainer.max_grad_norm);
  if (!start->optimizer_path.empty()) optimizer->Load(start->optimizer_path);
  // Data parallel: meet the other ranks (blocks until all have joined) and
  // start from rank 0's weights. A resumed rank has loaded its own
  // checkpoint (optimizer state included), written at the same step as the
  // others': the ranks' updates are identical, so the states are too.
  std::unique_ptr<Collectives> collectives;
  if (rank->world_size > 1) {
    spdlog::info("data parallel: rank {} of {}, meeting at {}", rank->rank, rank->world_size,
                 rank->store);
    CollectivesOptions options;
    options.store = rank->store;
    options.rank = rank->rank;
    options.world_size = rank->world_size;
    options.device = start->student->parameters().front().device();
    // A collective waits for the slowest rank's batch, so this bounds how
    // long any rank may go without groups before the run fails.
    options.timeout = std::chrono::minutes(30);
    try {
      collectives = ConnectCollectives(options);
      optimizer->set_collectives(collectives.get());
    } catch (const std::exception& e) {
      spdlog::error("data parallel: {}", e.what());
      return 1;
    }
    spdlog::info("data parallel: all {} ranks joined", rank->world_size);
    // Resumed ranks must stand at the same step, or their loops would run a
    // different number of collectives; all ranks learn of a mismatch at once.
    const torch::Tensor step = torch::tensor({start->state.step}, torch::kLong).to(options.device);
    const torch::Tensor rank0_step = step.clone();
    collectives->Broadcast({rank0_step}, 0);
    const torch::Tensor mismatches = (step != rank0_step).to(torch::kLong);
    collectives->SumInPlace({mismatches});
    if (mismatches.item<int64_t>() > 0) {
      spdlog::error("data parallel: the ranks start from different steps (this rank {}, rank 0 "
                    "{}); resume every rank from the same checkpoint step",
                    start->state.step, rank0_step.item<int64_t>());
      return 1;
    }
  }

  CoordinatorOptions coordinator_options;
  coordinator_options.buffer_groups = config->learner.buffer_groups;
  coordinator_options.max_staleness = config->learner.max_staleness;
  coordinator_options.lease_timeout = absl::Milliseconds(config->learner.lease_timeout_ms);
  coordinator_options.rank = rank->rank;
  coordinator_options.world_size = rank->world_size;
  Coordinator coordinator((*train)->size(), config->seed, start->state.data_position,
                          coordinator_options);
  // A resumed run first trains on what was in flight at its checkpoint (the
  // prompt source continues after the last prompt drawn). Before the server
  // starts, so no worker can lease a new prompt ahead of them.
  coordinator.Requeue(std::vector<size_t>(start->state.pending_prompts.begin(),
                                          start->state.pending_prompts.end()));
  PolicyPublisher publisher;

  WorkTemplate work = WorkTemplateFor(*config);
  work.vocab_limit = static_cast<int32_t>(vocab_limit);
  work.stop_token_ids.assign(stop_token_ids.begin(), stop_token_ids.end());
  const GroupExpectations expect = GroupExpectationsFor(work, vocab_limit);
  spdlog::info(
      "work items: G={} max_new_tokens={} teacher_form={} teacher_demonstrations={} "
      "vocab_limit={} stop ids [{}] stop strings {}",
      work.group_size, work.max_new_tokens, work.teacher_form, work.teacher_demonstrations,
      work.vocab_limit, absl::StrJoin(work.stop_token_ids, ", "), work.stop_strings.size());
  LearnerService service(
      **train,
      [&train_prompts](size_t example_index) {
        const std::vector<int64_t>& ids = (*train_prompts)[example_index];
        return std::vector<int32_t>(ids.begin(), ids.end());
      },
      work, expect, &coordinator, &publisher);

  absl::StatusOr<services::ServerOptions> server_options =
      services::ServerOptionsFromConfig(*config);
  if (!server_options.ok()) {
    spdlog::error("{}", server_options.status().ToString());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<services::GrpcServer>> server =
      services::GrpcServer::Start(address, {&service}, *server_options);
  if (!server.ok()) {
    spdlog::error("cannot serve on {}: {}", address, server.status().ToString());
    return 1;
  }
  spdlog::info("learner serving on {} ({}; run dir {})", address,
               services::DescribeTransport(server_options->security), run_dir);

  TrainerLoop trainer(*config, run_dir, start->student, std::move(optimizer), start->state,
                      &coordinator, &publisher, **heldout, *prompts, vocab_limit, *rank);
  // One registry for the process; /metrics only when asked for.
  services::metrics::Registry registry;
  LearnerMetrics learner_metrics(registry);
  registry.AddCollectHook([&] {
    learner_metrics.RecordCoordinator(coordinator.counters());
    learner_metrics.RecordInvalidGroups(service.counters().groups_invalid.load());
  });
  trainer.set_metrics(&learner_metrics);
  absl::StatusOr<std::unique_ptr<services::metrics::MetricsServer>> metrics_server =
      services::metrics::ServeMetricsIfRequested(flags->metrics_address, &registry);
  if (!metrics_server.ok()) {
    spdlog::error("{}", metrics_server.status().ToString());
    return 1;
  }
  absl::Status status = trainer.Run([] { return services::TerminationRequested(); });

  service.Shutdown();
  coordinator.Shutdown();
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
