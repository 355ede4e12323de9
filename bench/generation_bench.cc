// Generation throughput: model::Sample (the decode engine, one slot per
// row, KV cache) against
//   nocache:    the same batched loop without a cache, which re-runs the
//               whole prefix through Decoder::Forward at every step;
//   per_prompt: model::Sample with the cache, but one prompt's G rows per
//               call (a worker decoding one work item at a time), prompts
//               one after another.
//
// Model: configs/demo.yaml's student shape (hidden 128, ffn 352, 2 layers,
// 4 heads / 2 KV heads, vocab 51) with random weights (fixed seed) and
// max_position_embeddings raised from the demo's 16 to the longest prompt
// plus the longest response length, so every row can generate the full
// length. Batch: --group-size responses of each of --prompts prompts (prompt
// lengths 7..9, left-padded). Decoding is greedy with no stop ids (as
// tests/model/sampling_test.cc does), so every row generates
// exactly `length` tokens; the bench checks that, and that every other
// mode picks exactly the tokens the batched cache path picks (exit 1
// otherwise).
//
// Each round runs every (length, mode) once; rounds are interleaved
// round-robin. A warm-up round first runs every mode at 8 new tokens only
// (it initializes the thread pools and touches the weights; a no-cache run at
// 512 takes minutes on the CPU and would teach it nothing more).
// Reports medians. --threads sets torch's intra-op threads and, where libtorch
// calls a pthread OpenBLAS (Debian), OpenBLAS's own pool, which
// torch::set_num_threads does not reach.
// Usage: kappa_bench_generation [--lengths 32,128,512] [--prompts 8]
//        [--group-size 8] [--reps 3] [--threads T] [--device cpu|cuda]
//        [--modes nocache,per_prompt]   (the batched cache path always runs)
// With --modes engine it runs the continuous decode engine's bench instead
// (bench/generation_engine_bench.cc); the static path retired.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/demo_shape.h"
#include "bench/generation_engine_bench.h"
#include "bench/threads.h"
#include "model/model_config.h"
#include "model/sampling.h"
#include "model/transformer.h"

namespace {

using namespace kappa;

// Reference: Sample's loop (greedy), recomputing the prefix instead of
// caching it. Same left padding, attention mask and RoPE positions as Sample;
// the logits of the last column predict the next token.
std::vector<std::vector<int64_t>> GenerateNoCache(model::Decoder& model,
                                                  const std::vector<std::vector<int64_t>>& prompts,
                                                  const model::SamplingParams& params) {
  torch::NoGradGuard no_grad;
  const auto device = model->named_parameters().front().value().device();
  const int64_t B = static_cast<int64_t>(prompts.size());
  const int64_t max_pos = model->config().max_position_embeddings;
  int64_t max_len = 0;
  std::vector<int64_t> lengths;
  for (const auto& p : prompts) {
    lengths.push_back(static_cast<int64_t>(p.size()));
    max_len = std::max(max_len, lengths.back());
  }
  int64_t steps = 0;
  std::vector<int64_t> budgets;
  for (int64_t n : lengths) {
    budgets.push_back(std::min(params.max_new_tokens, max_pos - n));
    steps = std::max(steps, budgets.back());
  }
  std::vector<std::vector<int64_t>> results(prompts.size());
  if (steps == 0) return results;

  // The whole sequence buffer [B, max_len + steps - 1]; column max_len + k
  // holds the token fed at step k.
  const int64_t width = max_len + steps - 1;
  auto long_opts = torch::TensorOptions().dtype(torch::kLong);
  auto tokens = torch::full({B, width}, params.pad_id, long_opts);
  auto mask = torch::zeros({B, width}, long_opts);
  auto positions = torch::zeros({B, width}, long_opts);
  {
    auto tok_a = tokens.accessor<int64_t, 2>();
    auto mask_a = mask.accessor<int64_t, 2>();
    auto pos_a = positions.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = lengths[static_cast<size_t>(b)];
      for (int64_t t = 0; t < n; ++t) {
        tok_a[b][max_len - n + t] = prompts[static_cast<size_t>(b)][static_cast<size_t>(t)];
        mask_a[b][max_len - n + t] = 1;
        pos_a[b][max_len - n + t] = t;
      }
    }
  }
  tokens = tokens.to(device);
  mask = mask.to(device);
  positions = positions.to(device);
  auto lengths_t = torch::tensor(lengths, long_opts).to(device);
  auto budgets_t = torch::tensor(budgets, long_opts).to(device);

  auto finished = budgets_t.le(0);
  std::vector<torch::Tensor> step_tokens, step_active;
  int64_t width_now = max_len;
  for (int64_t k = 0; k < steps; ++k) {
    auto out = model->Forward(tokens.narrow(1, 0, width_now), mask.narrow(1, 0, width_now),
                              positions.narrow(1, 0, width_now));
    auto scaled = out.logits.select(1, width_now - 1).to(torch::kFloat32);
    auto logp = torch::log_softmax(scaled, -1);  // Sample's per-step work
    auto next = scaled.argmax(-1);
    auto lp = logp.gather(-1, next.unsqueeze(-1)).squeeze(-1);
    (void)lp;
    step_tokens.push_back(next);
    step_active.push_back(finished.logical_not());
    for (int64_t id : params.stop_token_ids) finished = finished.logical_or(next.eq(id));
    finished = finished.logical_or(budgets_t.le(k + 1));
    if (k + 1 == steps || finished.all().item<bool>()) break;
    tokens.select(1, width_now).copy_(torch::where(finished, torch::full_like(next, params.pad_id), next));
    mask.select(1, width_now).copy_(finished.logical_not());
    positions.select(1, width_now).copy_((lengths_t + k).clamp_max(max_pos - 1));
    ++width_now;
  }
  auto all_tokens = torch::stack(step_tokens, 1).cpu();
  auto all_active = torch::stack(step_active, 1).cpu();
  auto tok_a = all_tokens.accessor<int64_t, 2>();
  auto act_a = all_active.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < all_tokens.size(1) && act_a[b][k]; ++k) {
      results[static_cast<size_t>(b)].push_back(tok_a[b][k]);
    }
  }
  return results;
}

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& item : kappa::bench::SplitCommaList(text))
    out.push_back(std::atoll(item.c_str()));
  return out;
}

// One model::Sample call per prompt: rows [p·G, (p+1)·G) of `prompts`.
std::vector<std::vector<int64_t>> SamplePerPrompt(model::Decoder& model,
                                                  const std::vector<std::vector<int64_t>>& prompts,
                                                  int64_t group_size,
                                                  const model::SamplingParams& params) {
  std::vector<std::vector<int64_t>> tokens;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(group_size)) {
    const std::vector<std::vector<int64_t>> group(
        prompts.begin() + static_cast<std::ptrdiff_t>(first),
        prompts.begin() + static_cast<std::ptrdiff_t>(first + static_cast<size_t>(group_size)));
    for (const auto& s : model::Sample(model, group, params)) tokens.push_back(s.tokens);
  }
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  if (kappa::bench::WantsEngineComparison(argc, argv)) {
    return kappa::bench::RunEngineComparison(argc, argv);
  }
  std::string device_name = "cpu", lengths_text = "32,128,512", modes_text = "nocache";
  int reps = 3, threads = 0;
  int64_t num_prompts = 8, group_size = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--lengths") lengths_text = argv[i + 1];
    else if (flag == "--prompts") num_prompts = std::atoll(argv[i + 1]);
    else if (flag == "--group-size") group_size = std::atoll(argv[i + 1]);
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--device") device_name = argv[i + 1];
    else if (flag == "--modes") modes_text = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const std::vector<int64_t> lengths = ParseList(lengths_text);
  if (lengths.empty() || reps < 1 || num_prompts < 1 || group_size < 1) {
    std::fprintf(stderr, "need --lengths, --reps, --prompts, --group-size >= 1\n");
    return 2;
  }
  std::vector<std::string> modes = {"cache"};
  for (const std::string& mode : kappa::bench::SplitCommaList(modes_text)) {
    if (mode != "nocache" && mode != "per_prompt") {
      std::fprintf(stderr, "--modes: unknown mode %s (nocache, per_prompt)\n", mode.c_str());
      return 2;
    }
    if (std::find(modes.begin(), modes.end(), mode) == modes.end()) modes.push_back(mode);
  }
  if (threads > 0) kappa::bench::SetBenchThreads(threads);
  const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);

  // Prompts of 7..9 tokens (BOS, then pseudo-random ids 3..50), each G times.
  std::vector<std::vector<int64_t>> prompts;
  int64_t max_prompt = 0;
  for (int64_t p = 0; p < num_prompts; ++p) {
    std::vector<int64_t> prompt = {1};
    const int64_t len = 7 + p % 3;
    for (int64_t k = 1; k < len; ++k) prompt.push_back(3 + (p * 11 + k * 7) % 48);
    max_prompt = std::max(max_prompt, len);
    for (int64_t g = 0; g < group_size; ++g) prompts.push_back(prompt);
  }
  const int64_t rows = static_cast<int64_t>(prompts.size());

  model::ModelConfig config = bench::DemoShape();  // configs/demo.yaml's student
  config.max_position_embeddings =
      max_prompt + *std::max_element(lengths.begin(), lengths.end());  // the demo has 16
  torch::manual_seed(1);
  model::Decoder model(config);
  model->to(device);
  model->eval();

  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  std::map<std::pair<int64_t, std::string>, std::vector<double>> seconds;
  bool agree = true, full_length = true;
  const std::vector<int64_t> warmup = {8};
  for (int rep = -1; rep < reps; ++rep) {  // one warm-up round, 8 new tokens
    for (int64_t length : rep < 0 ? warmup : lengths) {
      model::SamplingParams params;
      params.max_new_tokens = length;
      params.temperature = 0.0;  // greedy
      params.stop_token_ids = {};  // never stops early
      params.pad_id = 0;
      std::vector<std::vector<int64_t>> cached;
      for (const std::string& mode : modes) {
        std::vector<std::vector<int64_t>> tokens;
        sync();
        const auto start = std::chrono::steady_clock::now();
        if (mode == "cache") {
          for (const auto& s : model::Sample(model, prompts, params)) tokens.push_back(s.tokens);
        } else if (mode == "per_prompt") {
          tokens = SamplePerPrompt(model, prompts, group_size, params);
        } else {
          tokens = GenerateNoCache(model, prompts, params);
        }
        sync();
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (rep >= 0) seconds[{length, mode}].push_back(s);
        std::fprintf(stderr, "round %d/%d length %lld %-10s %.3f s\n", rep + 1, reps,
                     static_cast<long long>(length), mode.c_str(), s);
        if (mode == "cache") {
          cached = std::move(tokens);
          for (const auto& c : cached) {
            if (static_cast<int64_t>(c.size()) != length) full_length = false;
          }
          continue;
        }
        for (int64_t r = 0; r < rows; ++r) {
          if (cached[static_cast<size_t>(r)] != tokens[static_cast<size_t>(r)]) {
            if (agree) {
              std::fprintf(stderr, "length %lld row %lld: cache and %s tokens differ\n",
                           static_cast<long long>(length), static_cast<long long>(r),
                           mode.c_str());
            }
            agree = false;
          }
        }
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "device=%s threads=%d rows=%lld (%lld prompts x G=%lld, prompt %lld..%lld tokens) reps=%d\n"
      "model: demo student shape, max_position_embeddings raised to %lld (demo: 16), greedy, "
      "no stop ids\n",
      device_name.c_str(), torch::get_num_threads(), static_cast<long long>(rows),
      static_cast<long long>(num_prompts), static_cast<long long>(group_size), 7LL,
      static_cast<long long>(max_prompt), reps,
      static_cast<long long>(config.max_position_embeddings));
  // cache_speedup: how many times faster the batched cache path (the
  // worker's, all prompts in one decode) is than the row's mode.
  std::printf("%7s %-10s %10s %12s %14s\n", "length", "mode", "median_s", "tokens/s",
              "cache_speedup");
  for (int64_t length : lengths) {
    const double cache_s = median(seconds[{length, "cache"}]);
    const double generated = static_cast<double>(rows * length);
    for (const std::string& mode : modes) {
      const double mode_s = median(seconds[{length, mode}]);
      std::printf("%7lld %-10s %10.3f %12.0f %14.2f\n", static_cast<long long>(length),
                  mode.c_str(), mode_s, generated / mode_s, mode_s / cache_s);
    }
  }
  std::printf("every row generated exactly its length: %s\n", full_length ? "yes" : "no");
  std::printf("tokens agree: %s\n", agree ? "yes" : "no");
  return agree && full_length ? 0 : 1;
}
