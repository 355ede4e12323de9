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
//   <shape> lora-*    student.lora (issue 41): the learner trains r = 16
//                     adapters (alpha 32, all seven projections) on frozen
//                     weights and snapshots as TrainerLoop::PublishPolicy
//                     does: the frozen weights copied once, in the snapshot
//                     dtype, and shared by every version's snapshot, plus
//                     fresh copies of the adapters, every element of which
//                     moves by 1e-5·N(0,1) per version; the watcher has
//                     lora_adapters (its held version is the delta base).
//                     lora-float32: float32 snapshot, wire and model;
//                     lora-bfloat16: bfloat16 snapshot (every worker asks
//                     for bfloat16, PolicySnapshotDtype), wire and model;
//                     lora-bfloat16-f32snap: float32 snapshot, bfloat16 wire
//                     and model (the publisher converts the frozen weights
//                     once, PolicySnapshot.frozen_weights).
//                     The last lines, `lora/full ...`, are LoRA's bytes and
//                     seconds per version over the full-weight case's.
//   <shape> lora-merge  not a sync: the alternative of a worker that merges
//                     the adapters into its own bfloat16 weights every
//                     version (model::MergedWeights, then a copy of the
//                     adapted projections into its inactive copy), timed
//                     against what the unmerged adapters add to one decode
//                     step (DecodeSlots over 1 and 8 slots, the same model
//                     before and after EnableLora, the adapters in
//                     bfloat16 as a worker keeps them).
// Versions 0 and 1 allocate the worker's two models (cold); from version 2
// the watcher reuses the inactive copy (steady state, what is reported as
// s/version). 1.5B float32 runs version 0 only: learner snapshot + two
// worker copies would be 18.6 GB. The learner's weights are made before the
// default dtype is set, explicitly float32.
//
// Usage: kappa_bench_weight_sync [--shapes 0.5b,1.5b] [--versions N]
//                                [--delta-layers N] [--no-delta] [--no-c10d]
//                                [--no-shm] [--no-lora] [--only CASE,CASE]
//                                [--threads N] [--blas-threads N] [--gap-s S]
//                                [--decode-steps N]
// (--threads: torch intra-op threads, which also split the shm write and
// read, and OpenBLAS's own pool, as the launcher's OPENBLAS_NUM_THREADS
// does; --blas-threads, after it: OpenBLAS's pool alone; --gap-s: seconds
// between versions, as a training step would leave, in which the learner
// prepares the next shm file; --decode-steps: the DecodeSlots steps
// lora-merge times per slot count, at most 60.)
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
#include "bench/threads.h"
#include "learner/coordinator.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/weight_broadcaster.h"
#include "learner/work_config.h"
#include "model/checkpoint.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "model/transformer.h"
#include "rollout_worker/policy_watcher.h"
#include "services/grpc_util.h"
#include "services/server.h"

namespace {

using kappa::learner::PolicySnapshot;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

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

// The LoRA cases' adapters: rank 16, alpha 32, on every projection.
kappa::model::LoraConfig BenchLora() {
  kappa::model::LoraConfig lora;
  lora.rank = 16;
  lora.alpha = 32.0;
  lora.target_modules = kappa::model::LoraTargetNames();
  return lora;
}

// A LoRA learner's adapters at `config`'s shape by kappa's names, float32
// CPU tensors of N(0, 0.02) values (B too: adapters some steps into
// training, not fresh zeros).
NamedTensors RandomAdapters(const kappa::model::ModelConfig& config,
                            const kappa::model::LoraConfig& lora) {
  kappa::model::Decoder shape(config, /*random_init=*/false,
                              kappa::model::Placement{torch::kCPU, torch::kBFloat16});
  shape->EnableLora(lora);
  torch::manual_seed(11);
  NamedTensors adapters;
  for (const auto& [name, parameter] : kappa::model::NamedAdapters(shape)) {
    adapters.emplace_back(name, torch::randn(parameter.sizes(), torch::kFloat32) * 0.02);
  }
  return adapters;
}

// One optimizer-like step of LoRA training: every adapter element moves.
void StepAdapters(NamedTensors& adapters) {
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : adapters) tensor = tensor + 1e-5 * torch::randn_like(tensor);
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
  // LoRA: frozen weights plus adapters (RandomAdapters), only these change.
  bool lora = false;
};

// A case's steady-state numbers (the means over versions 2.., else the
// last version's).
struct Result {
  double s_per_version = 0;  // Publish -> WaitForVersion returns
  double snapshot_s = 0;     // the learner's snapshot before Publish
  int64_t wire_bytes = 0;    // received by the watcher per version
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

// The learner's snapshot of a LoRA version as TrainerLoop::PublishPolicy
// takes it: `frozen` (the base weights copied into `dtype` at the first
// call, then the same tensors in every version, so the publisher's delta
// skips them by pointer) followed by fresh copies of the adapters.
NamedTensors LoraSnapshot(const NamedTensors& weights, const NamedTensors& adapters,
                          torch::ScalarType dtype, NamedTensors* frozen) {
  if (frozen->empty()) *frozen = SnapshotIn(weights, dtype);
  NamedTensors snapshot = *frozen;
  const NamedTensors trained = SnapshotIn(adapters, dtype);
  snapshot.insert(snapshot.end(), trained.begin(), trained.end());
  return snapshot;
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

// Runs one case (`adapters`: the LoRA cases' adapters, else empty).
Result Run(const Case& c, const kappa::model::ModelConfig& config,
           std::vector<std::pair<std::string, torch::Tensor>>& weights, NamedTensors& adapters,
           int delta_layers, double gap_s) {
  kappa::learner::PublisherOptions publisher_options;
  publisher_options.keep_delta_bases = c.delta || c.lora;  // as TrainerLoop under LoRA
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
    kappa::learner::WeightBroadcastOptions group;
    group.workers = 1;
    group.store = "tcp://127.0.0.1:0";
    group.dtype = c.wire;
    group.timeout = std::chrono::minutes(5);
    broadcaster = std::make_unique<kappa::learner::WeightBroadcaster>(&publisher, group);
    service.set_weight_broadcaster(broadcaster.get());
    if (absl::Status started = broadcaster->Start(); !started.ok()) {
      std::fprintf(stderr, "%s\n", started.ToString().c_str());
      std::exit(1);
    }
  }
  auto server = kappa::services::GrpcServer::Start("127.0.0.1:0", {&service});
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  kappa::rollout::PolicyWatcherOptions options{"bench"};
  options.dtype = c.model;
  kappa::rollout::WeightSyncOptions sync;
  sync.weights_dtype = c.wire;
  sync.weight_delta = c.delta;
  sync.lora_adapters = c.lora;
  sync.c10d = c.c10d;
  if (c.shm) sync.shm = kappa::rollout::WeightSyncOptions::Shm::kRequired;
  kappa::rollout::PolicyWatcher watcher(
      kappa::services::MakeChannel(absl::StrCat("127.0.0.1:", (*server)->port())), options, sync);
  watcher.Start();

  int64_t version_bytes = 0;
  for (const NamedTensors* tensors : {&weights, &adapters}) {
    for (const auto& [name, tensor] : *tensors) {
      version_bytes += tensor.numel() * static_cast<int64_t>(torch::elementSize(c.wire));
    }
  }
  const std::string adapter_config_json =
      c.lora ? kappa::model::AdapterConfigJson(BenchLora(), "bench") : "";
  NamedTensors frozen;  // LoRA: the snapshot's base weights, copied once
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
    if (c.lora && v > 0) StepAdapters(adapters);
    auto snapshot = std::make_shared<PolicySnapshot>();
    snapshot->version = v;
    snapshot->model_config_json = config.ToJson();
    snapshot->adapter_config_json = adapter_config_json;
    const absl::Time step_end = absl::Now();
    if (c.wire_snapshot) snapshot->dtype = c.wire;
    if (c.lora) {
      snapshot->weights = LoraSnapshot(weights, adapters, snapshot->dtype, &frozen);
      snapshot->frozen_weights = static_cast<int64_t>(frozen.size());
    } else if (c.wire_snapshot) {
      snapshot->weights = SnapshotIn(weights, c.wire);
    } else {
      snapshot->weights = weights;  // shares the tensors
    }
    snapshot_seconds.push_back(
        c.wire_snapshot || c.lora ? absl::ToDoubleSeconds(absl::Now() - step_end) : 0.0);
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
    if (c.wire_snapshot || c.lora) {
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
  return Result{reported, reported_snapshot, bytes};
}

// Mean seconds of one DecodeSlots step over `slots` slots at positions
// 64.., after two warm-up steps. REQUIRES: config's positions reach
// 66 + steps.
double SecondsPerDecodeStep(kappa::model::Decoder& model, int64_t slots, int steps) {
  torch::NoGradGuard no_grad;
  kappa::model::SlotKVCache cache = model->NewSlotCache(slots, 128);
  const int64_t vocab = model->config().vocab_size;
  std::vector<int64_t> tokens(static_cast<size_t>(slots));
  double total = 0;
  for (int step = -2; step < steps; ++step) {
    for (auto& token : tokens) token = torch::randint(0, vocab, {1}).item<int64_t>();
    const std::vector<int64_t> lengths(static_cast<size_t>(slots), 66 + step);
    const absl::Time start = absl::Now();
    model->DecodeSlots(tokens, lengths, &cache);
    if (step >= 0) total += absl::ToDoubleSeconds(absl::Now() - start);
  }
  return total / steps;
}

// Sets every adapter of `model` to N(0, 0.02) values (adapters after some
// training: B is not zero).
void RandomizeAdapters(kappa::model::Decoder& model) {
  torch::NoGradGuard no_grad;
  for (auto& [name, adapter] : kappa::model::NamedAdapters(model)) {
    adapter.copy_(torch::randn(adapter.sizes(), torch::kFloat32) * 0.02);
  }
}

// A merging worker's cost per version: model::MergedWeights on a bfloat16
// model with the adapters (W + s·B·A for every adapted projection), then
// the adapted projections copied into `target`, its inactive plain copy.
// Prints one line per repeat; returns the mean seconds of merge + copy.
double TimeMerges(kappa::model::Decoder& model, kappa::model::Decoder& target,
                  const std::string& shape, int repeats) {
  torch::NoGradGuard no_grad;
  const std::map<std::string, torch::Tensor> live = kappa::model::NamedWeights(model);
  std::map<std::string, torch::Tensor> into = kappa::model::NamedWeights(target);
  double total = 0;
  for (int r = 0; r < repeats; ++r) {
    const absl::Time start = absl::Now();
    const std::map<std::string, torch::Tensor> merged = kappa::model::MergedWeights(model);
    const double merge_s = absl::ToDoubleSeconds(absl::Now() - start);
    int64_t copied = 0;
    for (const auto& [name, tensor] : merged) {
      if (tensor.is_same(live.at(name))) continue;  // not adapted: the live weight
      into.at(name).copy_(tensor);
      copied += tensor.numel();
    }
    const double both_s = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("MERGE shape=%s repeat=%d merge_s=%.3f copy_s=%.3f total_s=%.3f adapted_M=%.1f\n",
                shape.c_str(), r, merge_s, both_s - merge_s, both_s, copied / 1e6);
    std::fflush(stdout);
    total += both_s;
  }
  return total / repeats;
}

// The lora-merge case: merging per version against decoding unmerged, on
// one bfloat16 model at `config`'s shape (the worker's dtype).
void CompareMergeWithUnmerged(const std::string& shape, const kappa::model::ModelConfig& config,
                              int decode_steps) {
  const kappa::model::Placement bf16{torch::kCPU, torch::kBFloat16};
  kappa::model::Decoder model(config, /*random_init=*/false, bf16);
  model->eval();
  const std::vector<int64_t> slot_counts = {1, 8};
  std::vector<double> plain;
  for (int64_t slots : slot_counts)
    plain.push_back(SecondsPerDecodeStep(model, slots, decode_steps));
  model->EnableLora(BenchLora());
  RandomizeAdapters(model);
  // In the model's dtype, as a rollout worker keeps them (PolicyWatcher).
  kappa::model::CastAdapters(model, torch::kBFloat16);
  std::vector<double> unmerged;
  for (int64_t slots : slot_counts) {
    unmerged.push_back(SecondsPerDecodeStep(model, slots, decode_steps));
  }
  kappa::model::Decoder target(config, /*random_init=*/false, bf16);
  const double merge_s = TimeMerges(model, target, shape, 3);
  for (size_t i = 0; i < slot_counts.size(); ++i) {
    const double overhead = unmerged[i] - plain[i];
    std::printf(
        "DECODE shape=%s slots=%lld plain_step_s=%.4f unmerged_step_s=%.4f overhead_step_s=%.4f "
        "(%.1f%%) overhead_per_token_s=%.5f merge_total_s=%.3f breakeven_decode_steps=%.0f\n",
        shape.c_str(), static_cast<long long>(slot_counts[i]), plain[i], unmerged[i], overhead,
        100.0 * overhead / plain[i], overhead / static_cast<double>(slot_counts[i]), merge_s,
        overhead > 0 ? merge_s / overhead : -1.0);
  }
  std::fflush(stdout);
}

// `lora/full` lines: each LoRA case against the full-weight case of the
// same wire dtype measured in this run.
void PrintLoraRatios(const std::map<std::string, Result>& results,
                     const std::vector<std::string>& shapes) {
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"lora-float32", "float32"},
      {"lora-bfloat16", "bfloat16-snap"},
      {"lora-bfloat16", "bfloat16"},
      {"lora-bfloat16-f32snap", "bfloat16"}};
  for (const std::string& shape : shapes) {
    for (const auto& [lora_label, full_label] : pairs) {
      const auto lora = results.find(shape + " " + lora_label);
      const auto full = results.find(shape + " " + full_label);
      if (lora == results.end() || full == results.end()) continue;
      const Result& l = lora->second;
      const Result& f = full->second;
      std::printf(
          "lora/full %s %s/%s wire_bytes_ratio=%.4f s_per_version_ratio=%.3f "
          "step_end_to_use_ratio=%.3f\n",
          shape.c_str(), lora_label.c_str(), full_label.c_str(),
          static_cast<double>(l.wire_bytes) / static_cast<double>(f.wire_bytes),
          l.s_per_version / f.s_per_version,
          (l.snapshot_s + l.s_per_version) / (f.snapshot_s + f.s_per_version));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> shapes = {"0.5b", "1.5b"};
  int versions = 4;
  int delta_layers = 1;
  bool delta = true;
  bool c10d = true;
  bool shm = true;
  bool lora = true;
  int decode_steps = 8;
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
    } else if (flag == "--no-lora") {
      lora = false;
    } else if (flag == "--decode-steps") {
      // Positions 66.. of Shape()'s 128: at most 60 steps.
      decode_steps = std::clamp(std::atoi(value().c_str()), 1, 60);
    } else if (flag == "--threads") {
      kappa::bench::SetBenchThreads(std::max(1, std::atoi(value().c_str())));
    } else if (flag == "--blas-threads") {
      kappa::bench::SetBlasThreads(std::max(1, std::atoi(value().c_str())));
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
  std::map<std::string, Result> results;  // "<shape> <case>" -> its numbers
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
    if (lora && !big) {  // 1.5B: fp32 weights + their frozen copy + two worker copies, > 16 GB
      Case lora_case{shape, "lora-float32", torch::kFloat32, torch::kFloat32, false, versions};
      lora_case.lora = true;
      cases.push_back(lora_case);
      lora_case.label = "lora-bfloat16";
      lora_case.wire = lora_case.model = torch::kBFloat16;
      lora_case.wire_snapshot = true;
      cases.push_back(lora_case);
      lora_case.label = "lora-bfloat16-f32snap";
      lora_case.wire_snapshot = false;
      cases.push_back(lora_case);
    }
    const auto wanted = [&](const std::string& label) {
      return only.empty() || std::find(only.begin(), only.end(), label) != only.end();
    };
    if (!only.empty()) {
      std::vector<Case> kept;
      for (const Case& c : cases) {
        if (std::find(only.begin(), only.end(), c.label) != only.end()) kept.push_back(c);
      }
      cases = kept;
    }
    for (const Case& c : cases) {
      std::vector<std::pair<std::string, torch::Tensor>> weights = RandomWeights(config);
      NamedTensors adapters = c.lora ? RandomAdapters(config, BenchLora()) : NamedTensors{};
      // model::Decoder builds its parameters in the default dtype and the
      // watcher converts them: for the bfloat16 cases they are built in
      // bfloat16 here, or a fresh 1.5B copy would pass through 6.2 GB of
      // float32 (the worker binary does that: cold versions cost more there).
      torch::set_default_dtype(c10::scalarTypeToTypeMeta(c.model));
      results[c.shape + " " + c.label] = Run(c, config, weights, adapters, delta_layers, gap_s);
      torch::set_default_dtype(c10::scalarTypeToTypeMeta(torch::kFloat32));
    }
    if (lora && !big && wanted("lora-merge")) CompareMergeWithUnmerged(shape, config, decode_steps);
  }
  for (const std::string& shape : shapes) {
    for (const char* dtype : {"float32", "bfloat16"}) {
      const auto grpc = results.find(shape + " " + dtype);
      const auto c10d_case = results.find(shape + " c10d-" + dtype);
      if (grpc == results.end() || c10d_case == results.end()) continue;
      std::printf("c10d/grpc %s %s s_per_version_ratio=%.3f\n", shape.c_str(), dtype,
                  c10d_case->second.s_per_version / grpc->second.s_per_version);
    }
    for (const char* label : {"float32", "bfloat16", "bfloat16-snap"}) {
      const auto grpc = results.find(shape + " " + label);
      const auto shm_case = results.find(shape + " shm-" + label);
      if (grpc == results.end() || shm_case == results.end()) continue;
      std::printf("shm/grpc %s %s s_per_version_ratio=%.3f\n", shape.c_str(), label,
                  shm_case->second.s_per_version / grpc->second.s_per_version);
    }
  }
  PrintLoraRatios(results, shapes);
  return 0;
}
