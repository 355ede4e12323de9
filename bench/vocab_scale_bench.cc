// Memory and time of one monitored learner step at a real vocabulary: the
// Qwen2.5-0.5B shape (vocab 151,936) with random fp32 weights on the CPU,
// 8 sequences × 512 tokens, full-vocabulary or top-64 teacher rows, with and
// without the chunked vocabulary head (trainer.vocab_chunk_positions) and
// activation checkpointing.
//
// ONE configuration per process, since peak RSS (getrusage's ru_maxrss) is
// the process's high-water mark; bench/vocab_scale_bench.sh runs the matrix.
// The process builds what the learner holds, in the learner's order: the
// model, then the scored groups with their teacher rows per sample ([T, V]
// each for --teacher full, [T, 64] log-probs + ids for topk), the TrainBatch
// from them (the groups are then dropped), then --steps HybridStep::Run
// steps, by default with κ and the cheap K_DR every step
// (monitor.kappa_every=1, kdr_every=1: the monitored step, two backward
// passes); --kappa 0 --kdr 0 is the plain step (one backward pass of
// L_R + λ L_D, no K_DR), the like-for-like counterpart of the eager
// reference (bench/eager_reference/vocab_step.py).
//
// Prints one JSON line: the configuration, each step's seconds and process
// CPU seconds (the first includes allocator and thread-pool warm-up: compare
// the last), peak RSS
// after the batch was built and at the end, the batch's teacher bytes, and
// the first step's losses (all configurations start from the same weights
// and rows, so chunked and unchunked, with and without checkpointing, must
// agree to rounding), and the parameter counts: all, and the trainable ones
// (those the optimizer updates).
//
// --lora-rank R > 0 trains LoRA adapters instead of every weight (issue 41,
// student.lora): rank R, alpha 2R, on all seven projections (q k v o gate up
// down) of every layer, every other parameter frozen, as
// learner::TrainAdaptersOnly does. Fresh adapters have B = 0, so the first
// step's losses equal full training's; the gradients and the step differ.
// bench/lora_step_bench.sh runs full against LoRA, one process each.
//
// A failed allocation (the memory cap the script sets with ulimit -v)
// prints {"oom": true, ...} and exits 3.
//
// --teacher hidden (issue 53, teacher.rows: hidden): each sample carries
// the teacher's hidden states [T, D_t] (D_t = --teacher-width, 896 by
// default: a 0.5B teacher) and the batch the teacher's head [V, D_t], both
// random (N(0, 1) states, N(0, 0.05²) head: peaked rows, not the flat ones
// of a 0.02 init); the loss is the exact reverse KL through the chunked
// head. Its like-for-like eager counterpart is vocab_step.py --teacher full.
// --fused 0 runs the head that recomputes each chunk in backward instead
// of the fused one (trainer.fused_head). The JSON line also carries each
// step's phases (HybridStepReport / StepStats host seconds): the decoder
// layers' forward, the head's forward (fused head only), the L_R, L_D and
// L_SFT backward passes and the update.
//
// Where the memory goes: a sampler thread reads VmRSS every 5 ms during
// each step; "phase_peak_rss_mib" gives, per step, the highest reading in
// each phase's interval (the phases laid end to end from the step's start
// in the order they run: layers forward, head forward, the backward
// passes, the update; "rest" is what follows, the step's bookkeeping);
// --sample-rss 0 turns the sampler off (the key is then an empty list).
//
// --device cuda runs the step on the GPU (bench/gpu/run.sh): the model, the
// batch and the teacher's head are built on the CPU as above, then moved;
// peak RSS then is the host's only (run.sh samples the device's memory).
// --precision bf16 runs the forward passes under bf16 autocast
// (HybridStepConfig::precision), as the learner does with student.dtype
// bfloat16.
//
// Usage: kappa_bench_vocab_scale --teacher full|topk|hidden [--chunk N] [--checkpointing 0|1]
//        [--layers 24] [--rows 8] [--group-size 4] [--prompt 64] [--response 448]
//        [--threads 2] [--steps 2] [--topk 64] [--kappa 0|1] [--kdr 0|1]
//        [--lora-rank R] [--teacher-width D] [--fused 0|1] [--device cpu|cuda]
//        [--precision fp32|bf16] [--vocab V] [--sample-rss 0|1]
//        [--world-size R --rank r --dist-store tcp://HOST:PORT [--shard none|optimizer|gradients]]
//
// --world-size R > 1: this process is one data-parallel rank (start R of
// them, ranks 0..R-1, at one store; each steps its own --rows), with
// --shard optimizer AdamW's state split over them, with --shard gradients
// the summed gradients too (learner.shard;
// bench/sharded_memory.sh runs the table of issue 54).
//
// --vocab V (151,936 by default) shrinks the vocabulary for the CPU
// rehearsal of bench/gpu/run.sh (the test command's toy sizes); the
// measurements use the real one.
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/qwen_shapes.h"
#include "bench/threads.h"
#include "dist/collectives.h"
#include "learner/algo/hybrid_step.h"
#include "learner/algo/train_batch.h"
#include "model/checkpoint.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/transformer.h"

namespace {

using namespace kappa;

struct Options {
  std::string teacher = "full";
  int64_t chunk = 0;
  bool checkpointing = false;
  int64_t layers = 24;
  int64_t rows = 8;
  int64_t group_size = 4;
  int64_t prompt = 64;
  int64_t response = 448;
  int threads = 2;
  int steps = 2;
  int64_t topk = 64;
  bool kappa = true;            // monitor.kappa_every = 1 (else 0)
  bool kdr = true;              // monitor.kdr_every = 1 (else 0)
  int64_t lora_rank = 0;        // 0: full training; R > 0: LoRA adapters only
  int64_t teacher_width = 896;  // D_t of --teacher hidden
  bool fused = true;            // trainer.fused_head
  std::string device = "cpu";   // cpu | cuda
  std::string precision = "fp32";
  int64_t vocab = 151936;
  bool sample_rss = true;  // the per-phase peaks (--sample-rss 0: off)
  // Data parallel (issue 54): this process is rank `rank` of `world_size`,
  // meeting at `dist_store`, each rank stepping its own --rows; with
  // `shard` (learner.shard) other than "none", AdamW's state, and under
  // "gradients" the summed gradients, are split over the ranks.
  int world_size = 1;
  int rank = 0;
  std::string dist_store;
  std::string shard = "none";
};

// LoRA rank R, alpha 2R, on every projection a decoder layer has.
model::LoraConfig BenchLora(int64_t rank) {
  model::LoraConfig lora;
  lora.rank = rank;
  lora.alpha = 2.0 * static_cast<double>(rank);
  lora.target_modules = model::LoraTargetNames();
  return lora;
}

// What learner::TrainAdaptersOnly (learner/student_lora.cc) does: attach
// fresh adapters and freeze every other parameter. Done here because that
// file lives in kappa_learner_step_config, which needs the services (gRPC),
// and this bench builds with libtorch only (the GPU machine builds it so).
void AttachAdaptersAndFreeze(model::Decoder& model, const model::LoraConfig& lora) {
  model->EnableLora(lora);
  for (const auto& parameter : model->named_parameters()) {
    parameter.value().set_requires_grad(model::IsAdapterName(parameter.key()));
  }
}

// Parameters the optimizer updates (PolicyOptimizer takes those that
// require gradients).
int64_t TrainableParameters(model::Decoder& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.requires_grad() ? p.numel() : 0;
  return n;
}

double PeakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

// User + system CPU seconds of the process so far (all its threads).
double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// A "VmRSS:"-style field of /proc/self/status, in MiB (-1 if absent).
double StatusMiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream fields(line.substr(field.size() + 1));
      double kib = 0;
      fields >> kib;
      return kib / 1024.0;
    }
  }
  return -1;
}

// Random groups of `group_size` samples with 0/1 rewards, mixed in every
// group (so the advantages are non-zero), and random teacher rows generated
// per sample as the learner receives them: log_softmax(2·N(0,1)) rows over
// the vocabulary, whole ([T, V]) or their top k ([T, k] log-probs and ids).
// Both forms draw the same random numbers (chunks of 64 positions), so the
// top-k rows are exactly the top k of the full ones; the top-k form never
// holds more than one chunk of a full row.
std::vector<learner::ScoredGroup> SyntheticGroups(const Options& o, int64_t vocab) {
  torch::manual_seed(7);
  const bool full = o.teacher == "full";
  const bool hidden = o.teacher == "hidden";
  const int64_t num_groups = o.rows / o.group_size;
  std::vector<learner::ScoredGroup> groups(static_cast<size_t>(num_groups));
  for (int64_t g = 0; g < num_groups; ++g) {
    auto& group = groups[static_cast<size_t>(g)];
    const auto prompt = torch::randint(0, vocab, {o.prompt}, torch::kInt64);
    group.prompt_tokens.assign(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + o.prompt);
    const auto rewards = torch::randint(0, 2, {o.group_size}, torch::kInt64);
    for (int64_t i = 0; i < o.group_size; ++i) {
      learner::ScoredSample sample;
      const auto tokens = torch::randint(0, vocab, {o.response}, torch::kInt64);
      sample.response_tokens.assign(tokens.data_ptr<int64_t>(),
                                    tokens.data_ptr<int64_t>() + o.response);
      // Near the random student's log-probs (≈ −ln V), so the PPO ratio is ≈ 1.
      const auto behavior =
          -std::log(static_cast<double>(vocab)) + 0.1 * torch::randn({o.response});
      sample.behavior_logprobs.assign(behavior.data_ptr<float>(),
                                      behavior.data_ptr<float>() + o.response);
      int64_t reward = rewards[i].item<int64_t>();
      if (i == o.group_size - 1 && rewards.sum().item<int64_t>() % o.group_size == 0) {
        reward = 1 - reward;  // all equal so far: mix the group
      }
      sample.reward = static_cast<float>(reward);
      if (hidden) {
        sample.teacher_hidden = torch::randn({o.response, o.teacher_width});
        group.samples.push_back(std::move(sample));
        continue;
      }
      if (full) {
        sample.teacher_logprobs = torch::empty({o.response, vocab});
      } else {
        sample.teacher_logprobs = torch::empty({o.response, o.topk});
        sample.teacher_topk_ids = torch::empty({o.response, o.topk}, torch::kInt64);
      }
      for (int64_t t = 0; t < o.response; t += 64) {
        const int64_t n = std::min<int64_t>(64, o.response - t);
        const auto rows = torch::log_softmax(2 * torch::randn({n, vocab}), -1);
        if (full) {
          sample.teacher_logprobs.narrow(0, t, n).copy_(rows);
        } else {
          auto [values, ids] = rows.topk(o.topk, -1);
          sample.teacher_logprobs.narrow(0, t, n).copy_(values);
          sample.teacher_topk_ids.narrow(0, t, n).copy_(ids);
        }
      }
      group.samples.push_back(std::move(sample));
    }
  }
  return groups;
}

std::string ConfigJson(const Options& o) {
  char buffer[768];
  std::snprintf(
      buffer, sizeof buffer,
      "\"teacher\": \"%s\", \"chunk\": %lld, \"checkpointing\": %d, \"layers\": %lld, "
      "\"rows\": %lld, \"group_size\": %lld, \"prompt\": %lld, \"response\": %lld, "
      "\"threads\": %d, \"steps\": %d, \"topk\": %lld, \"kappa_every\": %d, \"kdr_every\": %d, "
      "\"lora_rank\": %lld, \"teacher_width\": %lld, \"fused\": %d, \"device\": \"%s\", "
      "\"precision\": \"%s\", \"world_size\": %d, \"rank\": %d, \"shard\": \"%s\"",
      o.teacher.c_str(), static_cast<long long>(o.chunk), o.checkpointing ? 1 : 0,
      static_cast<long long>(o.layers), static_cast<long long>(o.rows),
      static_cast<long long>(o.group_size), static_cast<long long>(o.prompt),
      static_cast<long long>(o.response), o.threads, o.steps, static_cast<long long>(o.topk),
      o.kappa ? 1 : 0, o.kdr ? 1 : 0, static_cast<long long>(o.lora_rank),
      static_cast<long long>(o.teacher_width), o.fused ? 1 : 0, o.device.c_str(),
      o.precision.c_str(), o.world_size, o.rank, o.shard.c_str());
  return buffer;
}

std::string Number(std::optional<double> x) {
  if (!x || !std::isfinite(*x)) return "null";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.9g", *x);
  return buffer;
}

// How far a run got, for the out-of-memory line.
struct Progress {
  const char* phase = "start";
  std::vector<double> seconds;      // of the steps completed
  std::vector<double> cpu_seconds;  // the same steps' process CPU time
};

std::string SecondsJson(const std::vector<double>& seconds);

// One step's phases, host seconds: {"layers_fwd", "head_fwd", "bwd_reward",
// "bwd_distill", "bwd_sft", "update"}.
std::string PhasesJson(const learner::HybridStepReport& r) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer,
                "{\"layers_fwd\": %.3f, \"head_fwd\": %.3f, \"bwd_reward\": %.3f, "
                "\"bwd_distill\": %.3f, \"bwd_sft\": %.3f, \"update\": %.3f}",
                r.forward_layers_seconds, r.forward_head_seconds, r.stats.backward_seconds[0],
                r.stats.backward_seconds[1], r.stats.backward_seconds[2], r.stats.update_seconds);
  return buffer;
}

// Samples the process's VmRSS every 5 ms on its own thread from
// construction until Stop(), each reading with its seconds since Start.
class RssSampler {
 public:
  RssSampler() : start_(std::chrono::steady_clock::now()), thread_([this] { Loop(); }) {}
  ~RssSampler() { Stop(); }
  RssSampler(const RssSampler&) = delete;
  RssSampler& operator=(const RssSampler&) = delete;

  // Waits for the thread; returns the (seconds, MiB) readings.
  const std::vector<std::pair<double, double>>& Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return readings_;
  }

 private:
  void Loop() {
    while (!stop_) {
      const double at =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      readings_.emplace_back(at, StatusMiB("VmRSS"));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  const std::chrono::steady_clock::time_point start_;
  std::atomic<bool> stop_{false};
  std::vector<std::pair<double, double>> readings_;  // written by the thread only
  std::thread thread_;
};

// The highest reading in each phase, the phases laid end to end in the order
// the step runs them (their seconds from the report).
std::string PhasePeaksJson(const learner::HybridStepReport& r,
                           const std::vector<std::pair<double, double>>& readings) {
  const learner::StepStats& s = r.stats;
  const std::pair<const char*, double> phases[] = {
      {"layers_fwd", r.forward_layers_seconds},
      {"head_fwd", r.forward_head_seconds},
      {"bwd", s.backward_seconds[0] + s.backward_seconds[1] + s.backward_seconds[2]},
      {"update", s.update_seconds},
      {"rest", 1e30}};
  std::string json = "{";
  double begin = 0;
  for (const auto& [name, seconds] : phases) {
    double peak = 0;
    for (const auto& [at, mib] : readings) {
      if (at >= begin && at < begin + seconds) peak = std::max(peak, mib);
    }
    char part[64];
    std::snprintf(part, sizeof part, "%s\"%s\": %.0f", begin > 0 ? ", " : "", name, peak);
    json += part;
    begin += seconds;
  }
  return json + "}";
}

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

int Run(const Options& o, Progress* progress) {
  const char** phase = &progress->phase;
  *phase = "model";
  model::ModelConfig config = bench::Qwen25HalfB(o.layers);
  if (o.vocab != config.vocab_size) {  // a toy vocabulary: its last id is the special one
    config.vocab_size = o.vocab;
    config.bos_token_id = config.pad_token_id = o.vocab - 1;
    config.eos_token_ids = {o.vocab - 1};
  }
  torch::manual_seed(1);
  model::Decoder model(config);
  model->SetActivationCheckpointing(o.checkpointing);
  if (o.lora_rank > 0) AttachAdaptersAndFreeze(model, BenchLora(o.lora_rank));
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const int64_t trainable = TrainableParameters(model);
  const double rss_model = StatusMiB("VmRSS");

  *phase = "batch";
  learner::TrainBatch batch;
  {
    std::vector<learner::ScoredGroup> groups = SyntheticGroups(o, config.vocab_size);
    batch = learner::BuildTrainBatch(groups, true, config.pad_token_id);
  }  // the groups (and their per-sample rows) go, as the learner drops them
  if (o.teacher == "hidden") {
    torch::manual_seed(8);
    batch.teacher_head.weight = 0.05 * torch::randn({config.vocab_size, o.teacher_width});
  }
  // Data parallel on CUDA: rank r computes on GPU r (bench/gpu/run.sh
  // starts two ranks only where there are two GPUs).
  const torch::Device device =
      o.device == "cuda"
          ? torch::Device(torch::kCUDA,
                          static_cast<c10::DeviceIndex>(o.world_size > 1 ? o.rank : 0))
          : torch::Device(torch::kCPU);
  if (device.is_cuda()) {
    model->to(device);
    batch = batch.To(device);
  }
  const double peak_build = PeakRssMiB();
  const double rss_batch = StatusMiB("VmRSS");

  *phase = "step";
  learner::HybridStepConfig step_config;
  step_config.loss.lambda = 1.0;
  step_config.loss.distill = o.teacher == "topk" ? learner::DistillLoss::kTopkTailReverseKl
                                                 : learner::DistillLoss::kReverseKl;
  step_config.loss.fused_head = o.fused;
  step_config.precision = learner::ParsePrecision(o.precision);
  step_config.loss.distill_topk = o.topk;
  step_config.loss.vocab_chunk_positions = o.chunk;
  step_config.monitor.kappa_every = o.kappa ? 1 : 0;
  step_config.monitor.kdr_every = o.kdr ? 1 : 0;
  // A tiny learning rate: the second step runs on (nearly) the first's weights.
  auto optimizer = std::make_unique<learner::PolicyOptimizer>(model, 1e-7, 0.0, 1.0);
  std::unique_ptr<dist::Collectives> collectives;
  if (o.world_size > 1) {
    *phase = "rendezvous";
    dist::CollectivesOptions options;
    options.store = o.dist_store;
    options.rank = o.rank;
    options.world_size = o.world_size;
    options.device = device;
    collectives = dist::ConnectCollectives(options);
    if (o.shard != "none") {
      optimizer->ShardState(o.shard == "gradients" ? kappa::learner::ShardStage::kGradients
                                                   : kappa::learner::ShardStage::kOptimizer,
                            o.rank, o.world_size);
    }
    optimizer->set_collectives(collectives.get());
    *phase = "step";
  }
  learner::HybridStep step(model, std::move(optimizer), step_config);
  std::vector<double>& seconds = progress->seconds;
  std::vector<double>& cpu_seconds = progress->cpu_seconds;
  std::optional<learner::HybridStepReport> first;
  std::vector<std::string> phases;       // one JSON object per step
  std::vector<std::string> phase_peaks;  // the same, peak VmRSS per phase
  for (int s = 0; s < o.steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    const double start_cpu = CpuSeconds();
    std::optional<RssSampler> sampler;
    if (o.sample_rss) sampler.emplace();
    learner::HybridStepReport report = step.Run(batch);
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    cpu_seconds.push_back(CpuSeconds() - start_cpu);
    phases.push_back(PhasesJson(report));
    if (sampler) phase_peaks.push_back(PhasePeaksJson(report, sampler->Stop()));
    std::fprintf(stderr, "step %d: %.1f s (CPU %.1f s), peak RSS %.0f MiB\n", s + 1, seconds.back(),
                 cpu_seconds.back(), PeakRssMiB());
    if (!first) first = std::move(report);
  }

  const std::string steps_json = SecondsJson(seconds);
  const learner::StepStats& stats = first->stats;
  std::printf(
      "{%s, \"oom\": false, \"parameters\": %lld, \"trainable_parameters\": %lld, "
      "\"batch_positions\": %lld, "
      "\"step_s\": [%s], \"cpu_s\": [%s], \"last_step_s\": %s, \"peak_rss_mib\": %.1f, "
      "\"peak_rss_after_build_mib\": %.1f, \"rss_model_mib\": %.1f, \"rss_batch_mib\": %.1f, "
      "\"vm_peak_mib\": %.1f, \"teacher_bytes\": %lld, \"reward_loss\": %s, "
      "\"distill_loss\": %s, \"grad_norm\": %s, \"reward_grad_norm\": %s, "
      "\"distill_grad_norm\": %s, \"kappa\": %s, \"entropy\": %s, \"kdr_mean\": %s, "
      "\"teacher_tail_mass\": %s, \"phases\": [%s], \"phase_peak_rss_mib\": [%s]}\n",
      ConfigJson(o).c_str(), static_cast<long long>(parameters), static_cast<long long>(trainable),
      static_cast<long long>(batch.input_tokens.numel()), steps_json.c_str(),
      SecondsJson(cpu_seconds).c_str(), Number(seconds.back()).c_str(), PeakRssMiB(), peak_build,
      rss_model, rss_batch, StatusMiB("VmPeak"), static_cast<long long>(batch.teacher_bytes()),
      Number(stats.reward_loss).c_str(), Number(stats.distill_loss).c_str(),
      Number(stats.grad_norm).c_str(), Number(stats.reward_grad_norm).c_str(),
      Number(stats.distill_grad_norm).c_str(), Number(stats.kappa()).c_str(),
      Number(first->entropy).c_str(),
      Number(first->kdr ? std::optional<double>(first->kdr->mean) : std::nullopt).c_str(),
      Number(first->teacher_tail_mass ? std::optional<double>(first->teacher_tail_mass->mean)
                                      : std::nullopt)
          .c_str(),
      Join(phases).c_str(), Join(phase_peaks).c_str());
  return 0;
}

std::string SecondsJson(const std::vector<double>& seconds) {
  std::string json;
  for (size_t i = 0; i < seconds.size(); ++i) json += (i ? ", " : "") + Number(seconds[i]);
  return json;
}

bool IsAllocationFailure(const std::string& what) {
  return what.find("can't allocate memory") != std::string::npos ||
         what.find("bad_alloc") != std::string::npos ||
         what.find("Cannot allocate memory") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--teacher")
      o.teacher = value;
    else if (flag == "--chunk")
      o.chunk = std::atoll(value);
    else if (flag == "--checkpointing")
      o.checkpointing = std::string(value) == "1";
    else if (flag == "--layers")
      o.layers = std::atoll(value);
    else if (flag == "--rows")
      o.rows = std::atoll(value);
    else if (flag == "--group-size")
      o.group_size = std::atoll(value);
    else if (flag == "--prompt")
      o.prompt = std::atoll(value);
    else if (flag == "--response")
      o.response = std::atoll(value);
    else if (flag == "--threads")
      o.threads = std::atoi(value);
    else if (flag == "--steps")
      o.steps = std::atoi(value);
    else if (flag == "--topk")
      o.topk = std::atoll(value);
    else if (flag == "--kappa")
      o.kappa = std::string(value) == "1";
    else if (flag == "--kdr")
      o.kdr = std::string(value) == "1";
    else if (flag == "--teacher-width")
      o.teacher_width = std::atoll(value);
    else if (flag == "--fused")
      o.fused = std::atoi(value) != 0;
    else if (flag == "--lora-rank")
      o.lora_rank = std::atoll(value);
    else if (flag == "--device")
      o.device = value;
    else if (flag == "--precision")
      o.precision = value;
    else if (flag == "--vocab")
      o.vocab = std::atoll(value);
    else if (flag == "--sample-rss")
      o.sample_rss = std::atoi(value) != 0;
    else if (flag == "--world-size")
      o.world_size = std::atoi(value);
    else if (flag == "--rank")
      o.rank = std::atoi(value);
    else if (flag == "--dist-store")
      o.dist_store = value;
    else if (flag == "--shard")
      o.shard = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "flag %s has no value\n", argv[argc - 1]);
    return 2;
  }
  if ((o.teacher != "full" && o.teacher != "topk" && o.teacher != "hidden") || o.chunk < 0 ||
      o.layers < 1 || o.group_size < 2 || o.rows < o.group_size || o.rows % o.group_size != 0 ||
      o.prompt < 1 || o.response < 1 || o.steps < 1 || o.topk < 1 || o.lora_rank < 0 ||
      o.teacher_width < 1 || (o.teacher == "hidden" && o.chunk == 0) || o.vocab < o.topk + 1 ||
      (o.device != "cpu" && o.device != "cuda") ||
      (o.precision != "fp32" && o.precision != "bf16") || o.world_size < 1 || o.rank < 0 ||
      o.rank >= o.world_size || (o.world_size > 1 && o.dist_store.empty()) ||
      (o.shard != "none" && o.shard != "optimizer" && o.shard != "gradients") ||
      (o.shard != "none" && o.world_size == 1)) {
    std::fprintf(stderr,
                 "bad flags: --teacher full|topk|hidden (hidden needs --chunk > 0), --chunk >= 0, "
                 "--group-size >= 2 dividing --rows, "
                 "--layers/--prompt/--response/--steps/--topk/--teacher-width >= 1, "
                 "--lora-rank >= 0, --device cpu|cuda, --precision fp32|bf16, --vocab > --topk, "
                 "--rank in [0, --world-size), --dist-store with --world-size > 1, "
                 "--shard none|optimizer|gradients (sharding needs --world-size > 1)\n");
    return 2;
  }
  if (o.threads > 0) kappa::bench::SetBenchThreads(o.threads);
  Progress progress;
  std::string failure;
  try {
    return Run(o, &progress);
  } catch (const std::bad_alloc& e) {
    failure = std::string("bad_alloc: ") + e.what();
  } catch (const std::exception& e) {
    failure = e.what();
    if (!IsAllocationFailure(failure)) {
      std::fprintf(stderr, "error (%s): %s\n", progress.phase, failure.c_str());
      return 1;
    }
  }
  // Out of memory (the address-space cap of the script, or the machine's).
  const std::string first_line = failure.substr(0, failure.find('\n'));
  std::fprintf(stderr, "out of memory (%s %zu): %s\n", progress.phase, progress.seconds.size() + 1,
               first_line.c_str());
  std::printf(
      "{%s, \"oom\": true, \"phase\": \"%s\", \"oom_step\": %zu, \"step_s\": [%s], "
      "\"cpu_s\": [%s], "
      "\"peak_rss_mib\": %.1f, \"vm_peak_mib\": %.1f}\n",
      ConfigJson(o).c_str(), progress.phase, progress.seconds.size() + 1,
      SecondsJson(progress.seconds).c_str(), SecondsJson(progress.cpu_seconds).c_str(),
      PeakRssMiB(), StatusMiB("VmPeak"));
  return 3;
}
