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
// Usage: kappa_bench_learner_step [--model demo|large] [--device cpu|cuda]
//        [--reps N] [--exact-positions K] [--threads T]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "learner/algo/hybrid_step.h"
#include "learner/algo/train_batch.h"
#include "model/model_config.h"
#include "model/transformer.h"

namespace {

using namespace kappa;

struct Shape {
  model::ModelConfig config;
  int64_t groups, group_size, prompt_len, response_len;
};

Shape ShapeFor(const std::string& name) {
  Shape s;
  model::ModelConfig& c = s.config;
  c.vocab_size = 51;  // the demo's character tokenizer
  if (name == "demo") {  // configs/demo.yaml: 2 layers, d=128; 8 groups × G=8
    c.hidden_size = 128;
    c.intermediate_size = 352;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 16;
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
    std::fprintf(stderr, "unknown --model '%s' (demo | large)\n", name.c_str());
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
      const int64_t len = s.response_len - (i % 3);
      for (int64_t k = 0; k < len; ++k) sample.response_tokens.push_back(3 + (g + 5 * i + 3 * k) % 45);
      sample.behavior_logprobs.assign(static_cast<size_t>(len), -2.0f);
      sample.reward = static_cast<float>((g + i) % 2);
      sample.teacher_logprobs = torch::log_softmax(2 * torch::randn({len, 51}), -1);
      group.samples.push_back(std::move(sample));
    }
  }
  return groups;
}

struct Mode {
  const char* name;
  int64_t kappa_every, kdr_every, exact_every;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "demo", device_name = "cpu";
  int reps = 20, exact_positions = 8, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model_name = argv[i + 1];
    else if (flag == "--device") device_name = argv[i + 1];
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else if (flag == "--exact-positions") exact_positions = std::atoi(argv[i + 1]);
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (threads > 0) torch::set_num_threads(threads);
  const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);
  const Shape shape = ShapeFor(model_name);
  const learner::TrainBatch batch =
      learner::BuildTrainBatch(SyntheticGroups(shape), true, 0).To(device);

  std::vector<Mode> modes = {{"plain", 0, 0, 0},
                            {"kappa", 1, 0, 0},
                            {"kappa_kdr", 1, 1, 0},
                            {"kappa4_kdr", 4, 1, 0}};
  if (exact_positions > 0) modes.push_back({"exact", 1, 1, 1});  // 0: skip the slow mode
  std::vector<learner::HybridStep> steps;
  steps.reserve(modes.size());
  for (const Mode& mode : modes) {
    torch::manual_seed(1);
    model::Decoder model(shape.config);
    model->to(device);
    learner::HybridStepConfig config;
    config.loss.lambda = 1.0;
    config.monitor.kappa_every = mode.kappa_every;
    config.monitor.kdr_every = mode.kdr_every;
    config.monitor.kdr_exact_every = mode.exact_every;
    config.monitor.kdr_exact_positions = exact_positions;
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
  std::printf("model=%s device=%s threads=%d rows=%lld seq=%lld reps=%d\n", model_name.c_str(),
              device_name.c_str(), torch::get_num_threads(),
              static_cast<long long>(batch.input_tokens.size(0)),
              static_cast<long long>(batch.input_tokens.size(1)), reps);
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  };
  const double plain_mean = mean(seconds["plain"]);
  std::printf("%-10s %10s %8s %10s %8s\n", "mode", "median_ms", "ratio", "mean_ms", "ratio");
  for (const Mode& mode : modes) {
    const double t = median(seconds[mode.name]);
    const double m = mean(seconds[mode.name]);
    std::printf("%-10s %10.3f %8.3f %10.3f %8.3f\n", mode.name, 1e3 * t, t / plain, 1e3 * m,
                m / plain_mean);
  }
  if (exact_positions > 0) {
    const double exact_extra = median(seconds["exact"]) - median(seconds["kappa_kdr"]);
    std::printf("exact K_DR: %.3f ms per sampled position (%d positions)\n",
                1e3 * exact_extra / exact_positions, exact_positions);
  }
  return 0;
}
