// Weight sync seconds per policy version (issue 19): the learner's
// PolicyPublisher and LearnerService.WatchPolicy serving one rollout
// worker's PolicyWatcher over loopback gRPC, in one process, for random
// models shaped like Qwen2.5-0.5B and -1.5B (tied embeddings, V = 151,936).
// Timed from PolicyPublisher::Publish to the watcher's model being
// published (WaitForVersion returns): the wire encoding (bfloat16 conversion,
// delta XOR, once per version), the stream, and the worker writing every
// chunk straight into its inactive model copy.
//
// Cases (each its own publisher, server and watcher; freed before the next):
//   <shape> float32   float32 wire into a float32 model
//   <shape> bfloat16  bfloat16 wire into a bfloat16 model (rollout.weights_dtype=auto)
//   <shape> c10d-*    rollout.weight_transport: c10d: the learner's
//                     WeightBroadcaster sends each version to the watcher in
//                     a Gloo group of two (one broadcast per parameter, CPU
//                     tensors; NCCL on GPUs), no WatchPolicy stream
//   <shape> shm-*     rollout.weight_transport: shm: the learner writes each
//                     version once into a /dev/shm segment (converting
//                     float32 -> bfloat16 on the way, over the intra-op
//                     threads) and the watcher reads it straight into its
//                     inactive copy; one SHARED_MEMORY chunk on the stream
//   <shape> *-snap    the learner snapshots in the wire dtype before
//                     Publish, as TrainerLoop::PublishPolicy does when every
//                     worker asks for bfloat16 (PolicySnapshotDtype): the
//                     float32 -> bfloat16 conversion moves out of publish ->
//                     in use into the snapshot, and the line also reports
//                     step end -> in use (snapshot + publish -> in use)
//   <shape> delta-*   rollout.weight_delta: each version changes the tensors
//                     of the first --delta-layers layers by 1e-5·N(0,1)
//                     (an optimizer-like step on a few tensors), the rest
//                     stay bitwise equal; reports bytes sent and saved
// Versions 0 and 1 allocate the worker's two models (cold); from version 2
// the watcher reuses the inactive copy (steady state, what is reported as
// s/version). 1.5B float32 runs version 0 only: learner snapshot + two
// worker copies would be 18.6 GB. The learner's weights are made before the
// default dtype is set, explicitly float32.
//
// Usage: kappa_bench_weight_sync [--shapes 0.5b,1.5b] [--versions N]
//                                [--delta-layers N] [--no-delta] [--no-c10d]
//                                [--no-shm] [--only CASE,CASE]
//                                [--threads N] [--gap-s S]
// (--threads: torch intra-op threads, which also split the shm write and
// read; --gap-s: seconds between versions, as a training step would leave,
// in which the learner prepares the next shm file.)
// (--only keeps the named cases, e.g. bfloat16,shm-bfloat16-snap.)
// With shm cases, the last lines are `shm/grpc <shape> <case> ...` ratios.
// With c10d cases, the last lines are `c10d/grpc <shape> <dtype>
// s_per_version_ratio=X`: both paths on the same weights in one run.
#include <dirent.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/qwen_shapes.h"
#include "cli/free_port.h"
#include "learner/coordinator.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/weight_broadcaster.h"
#include "learner/work_config.h"
#include "model/checkpoint.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "rollout_worker/policy_watcher.h"
#include "services/grpc_util.h"
#include "services/server.h"

namespace {

using kappa::learner::PolicySnapshot;

// The Qwen2.5 shape named on the command line; a short position table
// (RoPE buffers are not weights and do not travel).
kappa::model::ModelConfig Shape(const std::string& name) {
  kappa::model::ModelConfig c;
  if (name == "0.5b") {
    c = kappa::bench::Qwen25HalfB();
  } else if (name == "1.5b") {
    c = kappa::bench::Qwen25OneAndHalfB();
  } else {
    std::fprintf(stderr, "unknown shape %s (0.5b, 1.5b)\n", name.c_str());
    std::exit(2);
  }
  c.max_position_embeddings = 128;
  return c;
}

double PeakRssGb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1 << 20);
}

class OneExample final : public kappa::tasks::Dataset {
 public:
  size_t size() const override { return 1; }
  const kappa::tasks::Example& at(size_t) const override { return example_; }

 private:
  kappa::tasks::Example example_{"e", "1+1=", "2", "arithmetic", ""};
};

// The learner's weights: N(0, 0.02)-like values tiled from a random pool
// (cheap at 1.5B; distinct per tensor), norms at 1, as float32 CPU tensors.
std::vector<std::pair<std::string, torch::Tensor>> RandomWeights(
    const kappa::model::ModelConfig& config) {
  torch::manual_seed(7);
  const torch::Tensor pool = torch::randn({int64_t{1} << 22}) * 0.02;
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  kappa::model::Decoder shape(config, /*random_init=*/false);
  int64_t salt = 0;
  for (const auto& [name, parameter] : kappa::model::NamedWeights(shape)) {
    torch::Tensor tensor = torch::empty(parameter.sizes(), torch::kFloat32);
    if (name.find("norm") != std::string::npos) {
      tensor.fill_(1.0);
    } else {
      torch::Tensor flat = tensor.view({-1});
      const int64_t n = flat.numel(), p = pool.numel();
      for (int64_t at = 0; at < n; at += p) {
        const int64_t len = std::min(p, n - at);
        const int64_t shift = (salt * 7919) % (p - len + 1);
        flat.narrow(0, at, len).copy_(pool.narrow(0, shift, len));
      }
      ++salt;
    }
    weights.emplace_back(name, tensor);
  }
  return weights;
}

struct Case {
  std::string shape;
  std::string label;
  torch::ScalarType wire;
  torch::ScalarType model;
  bool delta;
  int versions;
  bool c10d = false;
  bool shm = false;
  // Snapshot in the wire dtype before Publish (TrainerLoop, PolicySnapshotDtype).
  bool wire_snapshot = false;
};

// The learner's snapshot as TrainerLoop::PublishPolicy takes it: one copy
// per tensor, converted to `dtype` on the way.
std::vector<std::pair<std::string, torch::Tensor>> SnapshotIn(
    const std::vector<std::pair<std::string, torch::Tensor>>& weights, torch::ScalarType dtype) {
  std::vector<std::pair<std::string, torch::Tensor>> copy;
  for (const auto& [name, tensor] : weights) {
    copy.emplace_back(name, tensor.to(torch::TensorOptions(torch::kCPU).dtype(dtype),
                                      /*non_blocking=*/false, /*copy=*/true));
  }
  return copy;
}

// kappa-* files in /dev/shm now (the learner keeps its latest two).
int ShmSegmentsNow() {
  int n = 0;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) n += std::strncmp(entry->d_name, "kappa-", 6) == 0;
    closedir(dir);
  }
  return n;
}

// Runs one case; returns its reported seconds per version.
double Run(const Case& c, const kappa::model::ModelConfig& config,
           std::vector<std::pair<std::string, torch::Tensor>>& weights, int delta_layers,
           double gap_s) {
  kappa::learner::PublisherOptions publisher_options;
  publisher_options.keep_delta_bases = c.delta;
  kappa::learner::PolicyPublisher publisher(publisher_options);
  kappa::learner::WorkTemplate work;
  work.group_size = 2;
  work.max_new_tokens = 4;
  work.max_outstanding_limit = 4;
  OneExample dataset;
  kappa::learner::Coordinator coordinator(1, 1, 0, kappa::learner::CoordinatorOptions{});
  kappa::learner::LearnerService service(
      dataset, [](size_t) { return std::vector<int32_t>{1}; }, work,
      kappa::learner::GroupExpectationsFor(work, 151936), &coordinator, &publisher);
  std::unique_ptr<kappa::learner::WeightBroadcaster> broadcaster;
  if (c.c10d) {
    absl::StatusOr<int> port = kappa::cli::PickFreePort("127.0.0.1");
    if (!port.ok()) {
      std::fprintf(stderr, "%s\n", port.status().ToString().c_str());
      std::exit(1);
    }
    kappa::learner::WeightBroadcastOptions group;
    group.workers = 1;
    group.store = absl::StrCat("tcp://127.0.0.1:", *port);
    group.dtype = c.wire;
    group.timeout = std::chrono::minutes(5);
    broadcaster = std::make_unique<kappa::learner::WeightBroadcaster>(&publisher, group);
    service.set_weight_broadcaster(broadcaster.get());
    broadcaster->Start();
  }
  auto server = kappa::services::GrpcServer::Start("127.0.0.1:0", {&service});
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  kappa::rollout::PolicyWatcherOptions options{"bench"};
  options.dtype = c.model;
  kappa::rollout::WeightSyncOptions sync{c.wire, c.delta, c.c10d};
  if (c.shm) sync.shm = kappa::rollout::WeightSyncOptions::Shm::kRequired;
  kappa::rollout::PolicyWatcher watcher(
      kappa::services::MakeChannel(absl::StrCat("127.0.0.1:", (*server)->port())), options, sync);
  watcher.Start();

  int64_t version_bytes = 0;
  for (const auto& [name, tensor] : weights) {
    version_bytes += tensor.numel() * static_cast<int64_t>(torch::elementSize(c.wire));
  }
  std::vector<double> seconds;
  std::vector<double> snapshot_seconds;
  std::vector<int64_t> received;
  for (int v = 0; v < c.versions; ++v) {
    if (v > 0 && gap_s > 0) absl::SleepFor(absl::Seconds(gap_s));
    if (c.delta && v > 0) {
      // An optimizer-like step on the first layers' tensors; the rest are shared.
      torch::NoGradGuard no_grad;
      for (auto& [name, tensor] : weights) {
        for (int layer = 0; layer < delta_layers; ++layer) {
          if (name.rfind(absl::StrCat("model.layers.", layer, "."), 0) == 0) {
            tensor = tensor + 1e-5 * torch::randn_like(tensor);
          }
        }
      }
    }
    auto snapshot = std::make_shared<PolicySnapshot>();
    snapshot->version = v;
    snapshot->model_config_json = config.ToJson();
    const absl::Time step_end = absl::Now();
    if (c.wire_snapshot) {
      snapshot->dtype = c.wire;
      snapshot->weights = SnapshotIn(weights, c.wire);
    } else {
      snapshot->weights = weights;  // shares the tensors
    }
    snapshot_seconds.push_back(c.wire_snapshot ? absl::ToDoubleSeconds(absl::Now() - step_end)
                                               : 0.0);
    const int64_t before = watcher.bytes_received();
    const absl::Time start = absl::Now();
    publisher.Publish(std::move(snapshot));
    absl::StatusOr<kappa::rollout::Policy> policy =
        watcher.WaitForVersion(v, absl::Now() + absl::Minutes(5));
    const double s = absl::ToDoubleSeconds(absl::Now() - start);
    if (!policy.ok()) {
      std::fprintf(stderr, "version %d: %s\n", v, policy.status().ToString().c_str());
      std::exit(1);
    }
    seconds.push_back(s);
    received.push_back(watcher.bytes_received() - before);
    std::printf("  %s %-18s v%d %s %7.3f s  %8.1f MB on the wire  (%.2f GB/s)", c.shape.c_str(),
                c.label.c_str(), v, v < 2 ? "cold  " : "steady", s, received.back() / 1e6,
                received.back() / 1e9 / s);
    if (c.wire_snapshot) {
      std::printf("  snapshot %.3f s, step end -> in use %.3f s", snapshot_seconds.back(),
                  snapshot_seconds.back() + s);
    }
    if (c.shm) std::printf("  %d segments in /dev/shm", ShmSegmentsNow());
    std::printf("\n");
    std::fflush(stdout);
  }
  double steady = 0;
  double steady_snapshot = 0;
  int64_t steady_bytes = 0;
  int steady_n = 0;
  for (int v = 2; v < c.versions; ++v, ++steady_n) {
    steady += seconds[v];
    steady_snapshot += snapshot_seconds[v];
    steady_bytes += received[v];
  }
  const double reported = steady_n > 0 ? steady / steady_n : seconds.back();
  const double reported_snapshot =
      steady_n > 0 ? steady_snapshot / steady_n : snapshot_seconds.back();
  const int64_t bytes = steady_n > 0 ? steady_bytes / steady_n : received.back();
  std::printf(
      "RESULT shape=%s case=%s s_per_version=%.3f (%s) snapshot_s=%.3f step_end_to_use_s=%.3f "
      "wire_MB=%.1f full_MB=%.1f saved=%.1f%% models_allocated=%lld shm_versions=%lld "
      "peak_rss_GB=%.1f\n",
      c.shape.c_str(), c.label.c_str(), reported, steady_n > 0 ? "steady mean" : "version 0, cold",
      reported_snapshot, reported_snapshot + reported, bytes / 1e6, version_bytes / 1e6,
      100.0 * (1.0 - static_cast<double>(bytes) / version_bytes),
      static_cast<long long>(watcher.models_allocated()),
      static_cast<long long>(watcher.shm_versions()), PeakRssGb());
  std::fflush(stdout);
  watcher.Stop();
  service.Shutdown();
  if (broadcaster != nullptr) broadcaster->Stop();
  publisher.Shutdown();
  (*server)->Shutdown(absl::Seconds(1));
  return reported;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> shapes = {"0.5b", "1.5b"};
  int versions = 4;
  int delta_layers = 1;
  bool delta = true;
  bool c10d = true;
  bool shm = true;
  std::vector<std::string> only;
  double gap_s = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", flag.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (flag == "--shapes") {
      shapes = absl::StrSplit(value(), ',');
    } else if (flag == "--versions") {
      versions = std::max(1, std::atoi(value().c_str()));
    } else if (flag == "--delta-layers") {
      delta_layers = std::atoi(value().c_str());
    } else if (flag == "--no-delta") {
      delta = false;
    } else if (flag == "--no-c10d") {
      c10d = false;
    } else if (flag == "--no-shm") {
      shm = false;
    } else if (flag == "--threads") {
      torch::set_num_threads(std::max(1, std::atoi(value().c_str())));
    } else if (flag == "--gap-s") {
      gap_s = std::atof(value().c_str());
    } else if (flag == "--only") {
      only = absl::StrSplit(value(), ',');
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  std::map<std::string, double> seconds;  // "<shape> <case>" -> s/version
  std::printf("torch threads %d\n", torch::get_num_threads());
  for (const std::string& shape : shapes) {
    const kappa::model::ModelConfig config = Shape(shape);
    const bool big = shape == "1.5b";
    std::vector<Case> cases = {
        {shape, "float32", torch::kFloat32, torch::kFloat32, false, big ? 1 : versions},
        {shape, "bfloat16", torch::kBFloat16, torch::kBFloat16, false, versions}};
    if (c10d) {
      cases.push_back({shape, "c10d-float32", torch::kFloat32, torch::kFloat32, false,
                       big ? 1 : versions, true});
      cases.push_back(
          {shape, "c10d-bfloat16", torch::kBFloat16, torch::kBFloat16, false, versions, true});
    }
    if (delta && !big) {
      cases.push_back({shape, "delta-float32", torch::kFloat32, torch::kFloat32, true, versions});
      cases.push_back(
          {shape, "delta-bfloat16", torch::kBFloat16, torch::kBFloat16, true, versions});
    }
    if (shm) {
      cases.push_back({shape, "shm-float32", torch::kFloat32, torch::kFloat32, false,
                       big ? 1 : versions, false, true});
      cases.push_back({shape, "shm-bfloat16", torch::kBFloat16, torch::kBFloat16, false, versions,
                       false, true});
      if (!big) {  // 1.5B: + a bf16 snapshot per version would pass ~20 GB
        cases.push_back({shape, "bfloat16-snap", torch::kBFloat16, torch::kBFloat16, false,
                         versions, false, false, true});
        cases.push_back({shape, "shm-bfloat16-snap", torch::kBFloat16, torch::kBFloat16, false,
                         versions, false, true, true});
      }
    }
    if (!only.empty()) {
      std::vector<Case> kept;
      for (const Case& c : cases) {
        if (std::find(only.begin(), only.end(), c.label) != only.end()) kept.push_back(c);
      }
      cases = kept;
    }
    for (const Case& c : cases) {
      std::vector<std::pair<std::string, torch::Tensor>> weights = RandomWeights(config);
      // model::Decoder builds its parameters in the default dtype and the
      // watcher converts them: for the bfloat16 cases they are built in
      // bfloat16 here, or a fresh 1.5B copy would pass through 6.2 GB of
      // float32 (the worker binary does that: cold versions cost more there).
      torch::set_default_dtype(c10::scalarTypeToTypeMeta(c.model));
      seconds[c.shape + " " + c.label] = Run(c, config, weights, delta_layers, gap_s);
      torch::set_default_dtype(c10::scalarTypeToTypeMeta(torch::kFloat32));
    }
  }
  for (const std::string& shape : shapes) {
    for (const char* dtype : {"float32", "bfloat16"}) {
      const auto grpc = seconds.find(shape + " " + dtype);
      const auto c10d_case = seconds.find(shape + " c10d-" + dtype);
      if (grpc == seconds.end() || c10d_case == seconds.end()) continue;
      std::printf("c10d/grpc %s %s s_per_version_ratio=%.3f\n", shape.c_str(), dtype,
                  c10d_case->second / grpc->second);
    }
    for (const char* label : {"float32", "bfloat16", "bfloat16-snap"}) {
      const auto grpc = seconds.find(shape + " " + label);
      const auto shm_case = seconds.find(shape + " shm-" + label);
      if (grpc == seconds.end() || shm_case == seconds.end()) continue;
      std::printf("shm/grpc %s %s s_per_version_ratio=%.3f\n", shape.c_str(), label,
                  shm_case->second / grpc->second);
    }
  }
  return 0;
}
