// The continuous decode engine on a ragged workload:
//   engine: model::DecodeEngine with items × G slots: a row leaves its slot
//           the step it stops and the next waiting row takes it; a prompt
//           is prefilled once for its G rows. Every row draws from its own
//           seed (model::RowSeed).
// The static path it was compared against (model::Sample in batches of
// `--items` prompts, each batch waiting for its longest row) retired with
// issue 40: model::Sample is now this engine. bench/README.md keeps the
// recorded numbers of both for comparison.
//
// Ragged (--ragged 1, the default): random weights (HF init, std 0.02) give
// nearly uniform next-token distributions, so a stop set of V · 2 / budget
// ids ends a row with probability ≈ 2 / budget per step: lengths spread
// from 1 to the budget (geometric, ~13 % reach it), as real rollouts do.
// --ragged 0: no stop ids, every row runs to the budget (the control where
// a batch decode would lose nothing to waiting).
//
// Roofline: over the engine's decode-only steps (no prefill in them), the
// bytes a step must read — every weight once plus the keys/values of the
// columns its rows attend — over its time, against the copy bandwidth of one
// large tensor measured in the same run.
//
// Usage: kappa_bench_generation --modes engine [--ragged 1]
//        [--prompts 16] [--group-size 8] [--items 2] [--max-new-tokens 128]
//        [--prompt-tokens 64,128] [--hidden 512] [--layers 8] [--heads 8]
//        [--kv-heads 4] [--ffn 1536] [--vocab 32000] [--temperature 1]
//        [--reps 1] [--threads T] [--device cpu|cuda] [--dtype fp32|bf16]
#include "bench/generation_engine_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/threads.h"
#include "model/decode_engine.h"
#include "model/model_config.h"
#include "model/sampling.h"
#include "model/token_sampler.h"
#include "model/transformer.h"

namespace kappa::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string modes = "engine";
  bool ragged = true;
  int64_t prompts = 16, group_size = 8, items = 2, max_new_tokens = 128;
  int64_t prompt_min = 64, prompt_max = 128;
  int64_t hidden = 512, layers = 8, heads = 8, kv_heads = 4, ffn = 1536, vocab = 32000;
  double temperature = 1.0;
  int reps = 1, threads = 0;
  std::string device = "cpu", dtype = "fp32";
};

bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    auto number = [&] { return std::atoll(value.c_str()); };
    if (flag == "--modes")
      o->modes = value;
    else if (flag == "--ragged")
      o->ragged = number() != 0;
    else if (flag == "--prompts")
      o->prompts = number();
    else if (flag == "--group-size")
      o->group_size = number();
    else if (flag == "--items")
      o->items = number();
    else if (flag == "--max-new-tokens")
      o->max_new_tokens = number();
    else if (flag == "--prompt-tokens") {
      const std::vector<std::string> range = SplitCommaList(value);
      if (range.size() != 2) return false;
      o->prompt_min = std::atoll(range[0].c_str());
      o->prompt_max = std::atoll(range[1].c_str());
    } else if (flag == "--hidden")
      o->hidden = number();
    else if (flag == "--layers")
      o->layers = number();
    else if (flag == "--heads")
      o->heads = number();
    else if (flag == "--kv-heads")
      o->kv_heads = number();
    else if (flag == "--ffn")
      o->ffn = number();
    else if (flag == "--vocab")
      o->vocab = number();
    else if (flag == "--temperature")
      o->temperature = std::atof(value.c_str());
    else if (flag == "--reps")
      o->reps = static_cast<int>(number());
    else if (flag == "--threads")
      o->threads = static_cast<int>(number());
    else if (flag == "--device")
      o->device = value;
    else if (flag == "--dtype")
      o->dtype = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return false;
    }
  }
  return o->prompts >= 1 && o->group_size >= 1 && o->items >= 1 && o->max_new_tokens >= 1 &&
         o->prompt_min >= 1 && o->prompt_max >= o->prompt_min && o->reps >= 1 &&
         o->temperature > 0 && (o->dtype == "fp32" || o->dtype == "bf16");
}

struct Workload {
  std::vector<std::vector<int64_t>> prompts;  // one per prompt (not per row)
  std::vector<uint64_t> seeds;                // one per prompt
  std::vector<int64_t> stop_ids;
};

Workload MakeWorkload(const Options& o) {
  Workload w;
  std::mt19937_64 random(7);
  for (int64_t p = 0; p < o.prompts; ++p) {
    const int64_t length =
        o.prompt_min +
        static_cast<int64_t>(random() % static_cast<uint64_t>(o.prompt_max - o.prompt_min + 1));
    std::vector<int64_t> prompt;
    for (int64_t t = 0; t < length; ++t) {
      prompt.push_back(static_cast<int64_t>(random() % static_cast<uint64_t>(o.vocab)));
    }
    w.prompts.push_back(std::move(prompt));
    w.seeds.push_back(1000 + static_cast<uint64_t>(p));
  }
  if (o.ragged) {
    const int64_t count = std::max<int64_t>(1, o.vocab * 2 / o.max_new_tokens);
    for (int64_t k = 0; k < count; ++k) w.stop_ids.push_back(k * o.vocab / count);
  }
  return w;
}

// Tokens of every row, prompt-major (prompt p's rows are p·G .. p·G + G − 1).
using Rows = std::vector<std::vector<int64_t>>;

struct EngineRun {
  Rows rows;
  double decode_only_seconds = 0;
  int64_t decode_only_steps = 0;
  int64_t decode_only_kv_columns = 0;
  model::DecodeEngineStats stats;
};

EngineRun RunEngine(const std::shared_ptr<model::Decoder>& model, const Options& o,
                    const Workload& w, const std::function<void()>& sync) {
  model::DecodeEngineOptions engine_options;
  engine_options.max_rows = o.items * o.group_size;
  engine_options.max_sequence_tokens = o.prompt_max + o.max_new_tokens - 1;
  model::DecodeEngine engine(engine_options);
  for (int64_t p = 0; p < o.prompts; ++p) {
    model::DecodeRequest request;
    request.id = static_cast<uint64_t>(p);
    request.model = model;
    request.prompt = w.prompts[static_cast<size_t>(p)];
    request.num_samples = o.group_size;
    request.max_new_tokens = o.max_new_tokens;
    request.sampling.temperature = o.temperature;
    request.stop_token_ids = w.stop_ids;
    request.seed = w.seeds[static_cast<size_t>(p)];
    engine.Add(std::move(request));
  }
  EngineRun run;
  run.rows.resize(static_cast<size_t>(o.prompts * o.group_size));
  while (!engine.Idle()) {
    const model::DecodeEngineStats before = engine.stats();
    const auto start = Clock::now();
    std::vector<model::DecodeResult> finished = engine.Step();
    sync();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (engine.stats().prefills == before.prefills) {
      run.decode_only_seconds += seconds;
      ++run.decode_only_steps;
      run.decode_only_kv_columns += engine.stats().kv_columns_read - before.kv_columns_read;
    }
    for (model::DecodeResult& result : finished) {
      for (int64_t g = 0; g < o.group_size; ++g) {
        run.rows[static_cast<size_t>(static_cast<int64_t>(result.id) * o.group_size + g)] =
            std::move(result.samples[static_cast<size_t>(g)].tokens);
      }
    }
  }
  run.stats = engine.stats();
  return run;
}

// Bytes per second of one large device copy (read + write counted once each).
double CopyBandwidth(const torch::Device& device, const std::function<void()>& sync) {
  auto source =
      torch::ones({64 << 20}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  auto target = torch::empty_like(source);
  target.copy_(source);
  sync();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    target.copy_(source);
    sync();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(source.nbytes()) / seconds);
  }
  return best;
}

int64_t CountTokens(const Rows& rows) {
  int64_t total = 0;
  for (const auto& r : rows) total += static_cast<int64_t>(r.size());
  return total;
}

}  // namespace

std::vector<std::string> SplitCommaList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool WantsEngineComparison(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) != "--modes") continue;
    for (const std::string& mode : SplitCommaList(argv[i + 1])) {
      if (mode == "static" || mode == "engine") return true;  // static: refused by name
    }
  }
  return false;
}

int RunEngineComparison(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) {
    std::fprintf(stderr, "bad flags (see generation_engine_bench.cc for the usage)\n");
    return 2;
  }
  const std::vector<std::string> modes = SplitCommaList(o.modes);
  if (std::find(modes.begin(), modes.end(), "static") != modes.end()) {
    std::fprintf(stderr,
                 "--modes static: the static path retired (model::Sample is the engine now); "
                 "bench/README.md keeps its recorded numbers\n");
    return 2;
  }
  const bool run_engine = std::find(modes.begin(), modes.end(), "engine") != modes.end();
  if (o.threads > 0) SetBenchThreads(o.threads);
  const torch::Device device(o.device == "cuda" ? torch::kCUDA : torch::kCPU);
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };

  model::ModelConfig config;
  config.vocab_size = o.vocab;
  config.hidden_size = o.hidden;
  config.intermediate_size = o.ffn;
  config.num_hidden_layers = o.layers;
  config.num_attention_heads = o.heads;
  config.num_key_value_heads = o.kv_heads;
  config.max_position_embeddings = o.prompt_max + o.max_new_tokens;
  config.tie_word_embeddings = false;
  torch::manual_seed(1);
  auto model = std::make_shared<model::Decoder>(config);
  (*model)->to(device, o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32);
  (*model)->eval();
  const Workload workload = MakeWorkload(o);

  int64_t weight_bytes = 0;
  for (const auto& p : (*model)->parameters()) weight_bytes += static_cast<int64_t>(p.nbytes());
  const int64_t kv_bytes_per_column = 2 * config.num_hidden_layers * config.num_key_value_heads *
                                      config.head_dim() *
                                      static_cast<int64_t>(o.dtype == "bf16" ? 2 : 4);

  // Warm-up: thread pools, first-touch of the weights.
  {
    Options warm = o;
    warm.prompts = std::min<int64_t>(o.prompts, o.items);
    warm.max_new_tokens = 4;
    const Workload w = MakeWorkload(warm);
    if (run_engine) RunEngine(model, warm, w, sync);
  }

  std::vector<double> engine_s;
  EngineRun engine_run;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (run_engine) {
      sync();
      const auto start = Clock::now();
      engine_run = RunEngine(model, o, workload, sync);
      engine_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      std::fprintf(stderr, "round %d engine %.2f s\n", rep + 1, engine_s.back());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };

  std::printf(
      "device=%s dtype=%s threads=%d model: d=%lld layers=%lld heads=%lld/%lld ffn=%lld "
      "V=%lld (%.1fM parameters)\n",
      o.device.c_str(), o.dtype.c_str(), torch::get_num_threads(), static_cast<long long>(o.hidden),
      static_cast<long long>(o.layers), static_cast<long long>(o.heads),
      static_cast<long long>(o.kv_heads), static_cast<long long>(o.ffn),
      static_cast<long long>(o.vocab),
      static_cast<double>(weight_bytes) / (o.dtype == "bf16" ? 2 : 4) / 1e6);
  std::printf(
      "workload: %lld prompts x G=%lld, prompts %lld..%lld tokens, budget %lld, %s, "
      "temperature %.2f; %lld slots (%lld items of G)\n",
      static_cast<long long>(o.prompts), static_cast<long long>(o.group_size),
      static_cast<long long>(o.prompt_min), static_cast<long long>(o.prompt_max),
      static_cast<long long>(o.max_new_tokens),
      o.ragged ? "ragged (stop ids end rows)" : "no stop ids (every row to the budget)",
      o.temperature, static_cast<long long>(o.items * o.group_size),
      static_cast<long long>(o.items));
  if (!run_engine) return 0;
  std::vector<int64_t> lengths;
  for (const auto& r : engine_run.rows) lengths.push_back(static_cast<int64_t>(r.size()));
  std::sort(lengths.begin(), lengths.end());
  const int64_t at_budget = std::count(lengths.begin(), lengths.end(), o.max_new_tokens);
  std::printf(
      "response lengths: min %lld, median %lld, max %lld; %lld of %zu rows at the budget\n",
      static_cast<long long>(lengths.front()), static_cast<long long>(lengths[lengths.size() / 2]),
      static_cast<long long>(lengths.back()), static_cast<long long>(at_budget), lengths.size());
  std::printf("%-8s %10s %10s %12s\n", "mode", "median_s", "tokens", "tokens/s");
  {
    const int64_t tokens = CountTokens(engine_run.rows);
    const double engine_rate = static_cast<double>(tokens) / median(engine_s);
    std::printf("%-8s %10.2f %10lld %12.1f\n", "engine", median(engine_s),
                static_cast<long long>(tokens), engine_rate);
    const auto& st = engine_run.stats;
    std::printf(
        "engine: %lld steps, %lld prefills (one per prompt), slot occupancy %.2f, KV slots "
        "%.1f MB allocated %lld time(s)\n",
        static_cast<long long>(st.steps), static_cast<long long>(st.prefills),
        st.row_steps > 0 ? static_cast<double>(st.busy_row_steps) /
                               static_cast<double>(st.steps * o.items * o.group_size)
                         : 0.0,
        static_cast<double>(st.kv_cache_bytes) / 1e6,
        static_cast<long long>(st.kv_cache_allocations));
    if (engine_run.decode_only_steps > 0) {
      const double step_s =
          engine_run.decode_only_seconds / static_cast<double>(engine_run.decode_only_steps);
      const double bytes_per_step =
          static_cast<double>(weight_bytes) +
          static_cast<double>(engine_run.decode_only_kv_columns * kv_bytes_per_column) /
              static_cast<double>(engine_run.decode_only_steps);
      const double copy = CopyBandwidth(device, sync);
      std::printf(
          "roofline: decode step %.2f ms reads %.1f MB (weights %.1f MB + KV) = %.1f GB/s; "
          "copy bandwidth %.1f GB/s; fraction %.2f\n",
          1e3 * step_s, bytes_per_step / 1e6, static_cast<double>(weight_bytes) / 1e6,
          bytes_per_step / step_s / 1e9, copy / 1e9, bytes_per_step / step_s / copy);
    }
  }
  return 0;
}

}  // namespace kappa::bench
