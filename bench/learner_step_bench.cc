// Cost of the training-dynamics monitors on one learner step.
//
// Times HybridStep::Run on a fixed synthetic batch in four modes, in one
// process, interleaved round-robin so drift (thermal, other load) hits every
// mode alike, and reports each mode's median as a ratio to the plain step:
//   plain        no κ, no K_DR: one backward pass of L_R + λ L_D
//   kappa        separate backward passes of L_R and L_D (κ, cosine)
//   kappa_kdr    κ + the cheap K_DR estimators (logit, last_layer) on every position
//   exact        κ + cheap K_DR + exact K_DR on --exact-positions sampled positions
//   kappa4_kdr   cheap K_DR every step, κ every 4th step (monitor.kappa_every=4):
//                compare its mean, not its median, since 3 steps in 4 are plain
// Also prints tokens/s (every position of the padded batch) and, given the
// device's dense bf16 matrix rate (--peak-tflops), model FLOP utilization:
// the plain step's model FLOPs (below) per second over the peak, for every
// mode, so the monitors' overhead shows as lost utilization.
// Usage: kappa_bench_learner_step [--model demo|large|gpt] [--device cpu|cuda]
//        [--reps N] [--exact-positions K] [--threads T] [--modes plain,kappa,...]
//        [--precision fp32|bf16] [--peak-tflops F] [--micro-batch N] [--ragged 1]
//        [--checkpointing 1]
// --micro-batch N adds plain_micro and kappa_micro: the same steps with
// gradient accumulation over length-bucketed micro-batches of N sequences
// (trainer.micro_batch_sequences); with --ragged 1 the responses' lengths
// spread over 1/8..1 of the longest, where bucketing skips the padding.
// --checkpointing 1 adds plain_ckpt: the plain step with activation
// checkpointing (each layer recomputed in backward under the forward's
// autocast state), so with --precision bf16 its ratio is what the recompute
// costs at that precision.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/demo_shape.h"
#include "learner/algo/hybrid_step.h"
#include "learner/algo/train_batch.h"
#include "model/model_config.h"
#include "model/transformer.h"

namespace {

using namespace kappa;

struct Shape {
  model::ModelConfig config;
  int64_t groups, group_size, prompt_len, response_len;
  bool ragged = false;
};

// Model FLOPs of one plain training step (forward + backward = 3× the
// forward), the usual accounting: 2 per multiply-add of every weight matrix
// (the tied output projection included, the embedding lookup not), plus the
// causal attention scores and weighted sums (QKᵀ and AV: 2·2·T·d per token
// per layer for full attention, half of it under the causal mask).
double PlainStepFlops(const model::ModelConfig& c, int64_t rows, int64_t seq) {
  const double d = static_cast<double>(c.hidden_size);
  const double head_dim = d / static_cast<double>(c.num_attention_heads);
  const double kv = head_dim * static_cast<double>(c.num_key_value_heads);
  const double per_layer = d * d /*q*/ + 2 * d * kv /*k, v*/ + d * d /*o*/ +
                           3 * d * static_cast<double>(c.intermediate_size) /*gate, up, down*/;
  const double matmul_params = static_cast<double>(c.num_hidden_layers) * per_layer +
                               d * static_cast<double>(c.vocab_size);
  const double tokens = static_cast<double>(rows * seq);
  const double attention = static_cast<double>(c.num_hidden_layers) * 2.0 * static_cast<double>(seq) * d;
  return 3.0 * tokens * (2.0 * matmul_params + attention);
}

Shape ShapeFor(const std::string& name) {
  Shape s;
  model::ModelConfig& c = s.config;
  c.vocab_size = 51;  // the demo's character tokenizer
  if (name == "gpt") {  // GPT-2-small-sized: 12 layers, d=768, 16 sequences of 1024 tokens
    c.vocab_size = 32000;
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.num_key_value_heads = 12;
    c.max_position_embeddings = 1024;
    s.groups = 2;
    s.group_size = 8;
    s.prompt_len = 256;
    s.response_len = 768;
  } else if (name == "demo") {  // configs/demo.yaml: 2 layers, d=128; 8 groups × G=8
    c = bench::DemoShape();
    s.groups = 8;
    s.group_size = 8;
    s.prompt_len = 7;
    s.response_len = 5;
  } else if (name == "large") {  // 8 layers, d=512, sequences of 256 tokens
    c.hidden_size = 512;
    c.intermediate_size = 1408;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = 256;
    s.groups = 2;
    s.group_size = 4;
    s.prompt_len = 56;
    s.response_len = 200;
  } else {
    std::fprintf(stderr, "unknown --model '%s' (demo | large | gpt)\n", name.c_str());
    std::exit(2);
  }
  return s;
}

// Random groups with mixed rewards and full teacher rows.
std::vector<learner::ScoredGroup> SyntheticGroups(const Shape& s) {
  torch::manual_seed(7);
  std::vector<learner::ScoredGroup> groups(static_cast<size_t>(s.groups));
  for (int64_t g = 0; g < s.groups; ++g) {
    auto& group = groups[static_cast<size_t>(g)];
    group.prompt_tokens.push_back(1);
    for (int64_t k = 1; k < s.prompt_len; ++k) group.prompt_tokens.push_back(3 + (g * 7 + k) % 40);
    for (int64_t i = 0; i < s.group_size; ++i) {
      learner::ScoredSample sample;
      // --ragged: lengths spread over [response_len / 8, response_len], as
      // real rollouts are; otherwise nearly equal.
      const int64_t len =
          s.ragged ? std::max<int64_t>(1, s.response_len * (1 + (g * s.group_size + i) * 7 % 8) / 8)
                   : s.response_len - (i % 3);
      for (int64_t k = 0; k < len; ++k) sample.response_tokens.push_back(3 + (g + 5 * i + 3 * k) % 45);
      sample.behavior_logprobs.assign(static_cast<size_t>(len), -2.0f);
      sample.reward = static_cast<float>((g + i) % 2);
      sample.teacher_logprobs =
          torch::log_softmax(2 * torch::randn({len, s.config.vocab_size}), -1);
      group.samples.push_back(std::move(sample));
    }
  }
  return groups;
}

struct Mode {
  const char* name;
  int64_t kappa_every, kdr_every, exact_every;
  bool micro = false;  // gradient accumulation over --micro-batch sequences
  bool checkpointing = false;  // model::Decoder activation checkpointing
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "demo", device_name = "cpu", modes_flag, precision_name = "fp32";
  int reps = 20, exact_positions = 8, threads = 0;
  double peak_tflops = 0;
  int micro_batch = 0;  // > 0: also the modes plain_micro and kappa_micro
  bool ragged = false;
  bool checkpointing = false;  // also the mode plain_ckpt
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model_name = argv[i + 1];
    else if (flag == "--device") device_name = argv[i + 1];
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else if (flag == "--exact-positions") exact_positions = std::atoi(argv[i + 1]);
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--modes") modes_flag = argv[i + 1];
    else if (flag == "--precision") precision_name = argv[i + 1];
    else if (flag == "--peak-tflops") peak_tflops = std::atof(argv[i + 1]);
    else if (flag == "--micro-batch") micro_batch = std::atoi(argv[i + 1]);
    else if (flag == "--ragged") ragged = std::string(argv[i + 1]) == "1";
    else if (flag == "--checkpointing")
      checkpointing = std::string(argv[i + 1]) == "1";
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (threads > 0) torch::set_num_threads(threads);
  const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);
  Shape shape = ShapeFor(model_name);
  shape.ragged = ragged;
  const learner::TrainBatch batch =
      learner::BuildTrainBatch(SyntheticGroups(shape), true, 0).To(device);

  std::vector<Mode> modes = {{"plain", 0, 0, 0},
                            {"kappa", 1, 0, 0},
                            {"kappa_kdr", 1, 1, 0},
                            {"kappa4_kdr", 4, 1, 0}};
  if (micro_batch > 0) {
    modes.push_back({"plain_micro", 0, 0, 0, true});
    modes.push_back({"kappa_micro", 1, 0, 0, true});
  }
  if (checkpointing) modes.push_back({"plain_ckpt", 0, 0, 0, false, true});
  if (exact_positions > 0) modes.push_back({"exact", 1, 1, 1});  // 0: skip the slow mode
  // A subset, e.g. --modes plain,kappa; plain (the ratios' base) and the
  // --micro-batch modes always run.
  if (!modes_flag.empty()) {
    std::vector<Mode> chosen;
    for (const Mode& mode : modes) {
      if (mode.name == std::string("plain") || mode.micro || mode.checkpointing ||
          ("," + modes_flag + ",").find("," + std::string(mode.name) + ",") != std::string::npos) {
        chosen.push_back(mode);
      }
    }
    modes = chosen;
  }
  learner::Precision precision;
  try {
    precision = learner::ParsePrecision(precision_name);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "--precision: %s\n", e.what());
    return 2;
  }
  std::vector<learner::HybridStep> steps;
  steps.reserve(modes.size());
  for (const Mode& mode : modes) {
    torch::manual_seed(1);
    model::Decoder model(shape.config);
    model->to(device);
    model->SetActivationCheckpointing(mode.checkpointing);
    learner::HybridStepConfig config;
    config.loss.lambda = 1.0;
    config.monitor.kappa_every = mode.kappa_every;
    config.monitor.kdr_every = mode.kdr_every;
    config.monitor.kdr_exact_every = mode.exact_every;
    config.micro_batch_sequences = mode.micro ? micro_batch : 0;
    config.monitor.kdr_exact_positions = exact_positions;
    config.precision = precision;
    // A tiny learning rate keeps every mode on (nearly) the same weights.
    auto optimizer = std::make_unique<learner::PolicyOptimizer>(model, 1e-7, 0.0, 1.0);
    steps.emplace_back(model, std::move(optimizer), config);
  }
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  std::map<std::string, std::vector<double>> seconds;
  for (int rep = -2; rep < reps; ++rep) {  // two warm-up rounds
    for (size_t m = 0; m < modes.size(); ++m) {
      sync();
      const auto start = std::chrono::steady_clock::now();
      steps[m].Run(batch);
      sync();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (rep >= 0) seconds[modes[m].name].push_back(s);
      std::fprintf(stderr, "\rround %d/%d %-10s %.3f s   ", rep + 1, reps, modes[m].name, s);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::fprintf(stderr, "\n");
  const double plain = median(seconds["plain"]);
  const int64_t rows = batch.input_tokens.size(0), seq = batch.input_tokens.size(1);
  const double flops = PlainStepFlops(shape.config, rows, seq);
  std::printf("model=%s device=%s precision=%s threads=%d rows=%lld seq=%lld (real tokens %lld) "
              "reps=%d micro-batch=%d plain-step model GFLOP=%.1f\n",
              model_name.c_str(), device_name.c_str(), learner::PrecisionName(precision),
              torch::get_num_threads(), static_cast<long long>(rows), static_cast<long long>(seq),
              static_cast<long long>(batch.attention_mask.sum().item<int64_t>()), reps,
              micro_batch, flops / 1e9);
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  };
  const double plain_mean = mean(seconds["plain"]);
  std::printf("%-10s %10s %8s %10s %8s %12s %8s %6s\n", "mode", "median_ms", "ratio", "mean_ms",
              "ratio", "tokens/s", "TFLOP/s", "MFU");
  for (const Mode& mode : modes) {
    const double t = median(seconds[mode.name]);
    const double m = mean(seconds[mode.name]);
    const double tflops = flops / m / 1e12;
    std::printf("%-10s %10.3f %8.3f %10.3f %8.3f %12.0f %8.3g ", mode.name, 1e3 * t, t / plain,
                1e3 * m, m / plain_mean, static_cast<double>(rows * seq) / m, tflops);
    if (peak_tflops > 0) {
      std::printf("%5.1f%%\n", 100.0 * tflops / peak_tflops);
    } else {
      std::printf("%6s\n", "-");
    }
  }
  if (seconds.count("exact") && seconds.count("kappa_kdr")) {
    const double exact_extra = median(seconds["exact"]) - median(seconds["kappa_kdr"]);
    std::printf("exact K_DR: %.3f ms per sampled position (%d positions)\n",
                1e3 * exact_extra / exact_positions, exact_positions);
  }
  return 0;
}
