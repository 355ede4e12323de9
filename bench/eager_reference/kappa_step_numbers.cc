// The numbers of kappa's first learner step on the bench's synthetic batch,
// to set beside hybrid_step.py's "step1" lines: same seeds (7 for the teacher
// rows, 1 for the weights), same libtorch generator, so L_R, L_D, the entropy
// and the gradient norms should agree to float rounding.
// With REPS > 0 it then times HybridStep::Run per mode like the bench (modes
// interleaved, two warm-up rounds) and prints the median wall and process
// CPU time per step: CPU time is what to compare on a machine other jobs
// load, hybrid_step.py prints the same (cpu_median_ms).
// Usage: kappa_step_numbers demo|large [REPS [THREADS]]
// Built by check_numbers.sh against a kappa build directory (no CMake target).
// SyntheticGroups and the shapes are copied from bench/learner_step_bench.cc.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "learner/algo/hybrid_step.h"
#include "learner/algo/train_batch.h"
#include "model/model_config.h"
#include "model/transformer.h"

using namespace kappa;

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "demo";
  model::ModelConfig c;
  c.vocab_size = 51;
  int64_t groups, group_size, prompt_len, response_len;
  if (name == "demo") {
    c.hidden_size = 128; c.intermediate_size = 352; c.num_hidden_layers = 2;
    c.num_attention_heads = 4; c.num_key_value_heads = 2; c.max_position_embeddings = 16;
    groups = 8; group_size = 8; prompt_len = 7; response_len = 5;
  } else if (name == "large") {
    c.hidden_size = 512; c.intermediate_size = 1408; c.num_hidden_layers = 8;
    c.num_attention_heads = 8; c.num_key_value_heads = 4; c.max_position_embeddings = 256;
    groups = 2; group_size = 4; prompt_len = 56; response_len = 200;
  } else {
    std::fprintf(stderr, "usage: %s demo|large\n", argv[0]);
    return 2;
  }
  const int reps = argc > 2 ? std::atoi(argv[2]) : 0;
  torch::set_num_threads(argc > 3 ? std::atoi(argv[3]) : 1);
  torch::manual_seed(7);
  std::vector<learner::ScoredGroup> scored(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    auto& group = scored[static_cast<size_t>(g)];
    group.prompt_tokens.push_back(1);
    for (int64_t k = 1; k < prompt_len; ++k) group.prompt_tokens.push_back(3 + (g * 7 + k) % 40);
    for (int64_t i = 0; i < group_size; ++i) {
      learner::ScoredSample sample;
      const int64_t len = response_len - (i % 3);
      for (int64_t k = 0; k < len; ++k) sample.response_tokens.push_back(3 + (g + 5 * i + 3 * k) % 45);
      sample.behavior_logprobs.assign(static_cast<size_t>(len), -2.0f);
      sample.reward = static_cast<float>((g + i) % 2);
      sample.teacher_logprobs = torch::log_softmax(2 * torch::randn({len, 51}), -1);
      group.samples.push_back(std::move(sample));
    }
  }
  const learner::TrainBatch batch = learner::BuildTrainBatch(scored, true, 0);
  const std::vector<const char*> modes = {"plain", "kappa"};
  std::vector<learner::HybridStep> steps;
  steps.reserve(modes.size());
  for (const char* mode : modes) {
    torch::manual_seed(1);
    model::Decoder model(c);
    int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    learner::HybridStepConfig config;
    config.loss.lambda = 1.0;
    config.monitor.kappa_every = std::strcmp(mode, "kappa") == 0 ? 1 : 0;
    config.monitor.kdr_every = 0;
    steps.emplace_back(model, std::make_unique<learner::PolicyOptimizer>(model, 1e-7, 0.0, 1.0),
                       config);
    const learner::HybridStepReport r = steps.back().Run(batch);
    if (std::strcmp(mode, "plain") == 0) std::printf("kappa params=%lld\n", static_cast<long long>(params));
    std::printf("step1 %s: L_R=%.9g L_D=%.9g entropy=%.9g", mode, r.stats.reward_loss,
                r.stats.distill_loss, r.entropy);
    if (r.stats.measured) {
      std::printf(" grad_norm_R=%.9g grad_norm_D=%.9g cosine=%.9g", r.stats.reward_grad_norm,
                  r.stats.distill_grad_norm, r.stats.grad_cosine);
    }
    std::printf(" grad_norm=%.9g\n", r.stats.grad_norm);
  }
  if (reps <= 0) return 0;
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  std::vector<std::vector<double>> wall(modes.size()), cpu(modes.size());
  for (int rep = -2; rep < reps; ++rep) {  // the first steps above were warm-up too
    for (size_t m = 0; m < modes.size(); ++m) {
      const auto start = std::chrono::steady_clock::now();
      const double start_cpu = cpu_now();
      steps[m].Run(batch);
      if (rep < 0) continue;
      cpu[m].push_back(cpu_now() - start_cpu);
      wall[m].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("threads=%d reps=%d\nmedian_ms", torch::get_num_threads(), reps);
  for (size_t m = 0; m < modes.size(); ++m) std::printf(" %s=%.3f", modes[m], 1e3 * median(wall[m]));
  std::printf("\ncpu_median_ms");
  for (size_t m = 0; m < modes.size(); ++m) std::printf(" %s=%.3f", modes[m], 1e3 * median(cpu[m]));
  std::printf("\n");
  return 0;
}
