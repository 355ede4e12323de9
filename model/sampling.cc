#include "model/sampling.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/decode_engine.h"

namespace kappa::model {
namespace {

[[noreturn]] void Fail(const std::string& what) { throw std::invalid_argument("Sample: " + what); }

void CheckParams(const SamplingParams& params, int64_t vocab_size, size_t rows) {
  if (params.max_new_tokens < 0) Fail("max_new_tokens must be >= 0");
  if (params.pad_id < 0 || params.pad_id >= vocab_size) {
    Fail("pad_id " + std::to_string(params.pad_id) + " is outside the vocabulary");
  }
  for (int64_t id : params.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      Fail("stop id " + std::to_string(id) + " is outside the vocabulary [0, " +
           std::to_string(vocab_size) + ")");
    }
  }
  if (params.sampleable_vocab_size < 0 || params.sampleable_vocab_size > vocab_size) {
    Fail("sampleable_vocab_size " + std::to_string(params.sampleable_vocab_size) +
         " is outside [0, " + std::to_string(vocab_size) + "]");
  }
  TokenSampling row = params.token_sampling();
  if (row.sampleable_vocab_size == 0) row.sampleable_vocab_size = vocab_size;
  ValidateTokenSampling(row, vocab_size);
  if (!params.row_seeds.empty() && params.row_seeds.size() != rows) {
    Fail(std::to_string(params.row_seeds.size()) + " row_seeds for " + std::to_string(rows) +
         " prompts");
  }
}

void CheckPrompts(const std::vector<std::vector<int64_t>>& prompts, const ModelConfig& config) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    if (n == 0) Fail("prompt " + std::to_string(i) + " is empty");
    if (n > config.max_position_embeddings) {
      Fail("prompt " + std::to_string(i) + " has " + std::to_string(n) +
           " tokens, more than max_position_embeddings " +
           std::to_string(config.max_position_embeddings));
    }
    for (int64_t t : prompts[i]) {
      if (t < 0 || t >= config.vocab_size) {
        Fail("prompt " + std::to_string(i) + " has token id " + std::to_string(t) +
             " outside the vocabulary");
      }
    }
  }
}

// One seed per row: params.row_seeds, else RowSeed(base, b) with `base`
// drawn from `generator` on `device`.
std::vector<uint64_t> RowSeeds(const SamplingParams& params, size_t rows,
                               const std::optional<at::Generator>& generator,
                               const c10::Device& device) {
  if (!params.row_seeds.empty()) return params.row_seeds;
  const c10::optional<at::Generator> gen =
      generator ? c10::optional<at::Generator>(*generator) : c10::nullopt;
  const auto base = static_cast<uint64_t>(
      torch::randint(std::numeric_limits<int64_t>::max(), {1}, gen,
                     torch::TensorOptions().dtype(torch::kLong).device(device))
          .item<int64_t>());
  std::vector<uint64_t> seeds;
  for (size_t b = 0; b < rows; ++b) seeds.push_back(RowSeed(base, static_cast<int64_t>(b)));
  return seeds;
}

// A row's budget: max_new_tokens, cut to what the position table leaves.
int64_t Budget(const SamplingParams& params, const std::vector<int64_t>& prompt,
               const ModelConfig& config) {
  return std::min(params.max_new_tokens,
                  config.max_position_embeddings - static_cast<int64_t>(prompt.size()));
}

}  // namespace

at::Generator MakeGenerator(const c10::Device& device, uint64_t seed) {
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Generator base = at::globalContext().defaultGenerator(device);
  at::Generator generator;
  {
    std::lock_guard<std::mutex> lock(base.mutex());
    generator = base.clone();
  }
  generator.set_current_seed(seed);
  return generator;
}

std::vector<SampledSequence> Sample(Decoder& model,
                                    const std::vector<std::vector<int64_t>>& prompts,
                                    const SamplingParams& params,
                                    std::optional<at::Generator> generator) {
  const ModelConfig& config = model->config();
  CheckParams(params, config.vocab_size, prompts.size());
  CheckPrompts(prompts, config);
  std::vector<SampledSequence> results(prompts.size());
  if (prompts.empty()) return results;
  torch::NoGradGuard no_grad;
  const std::vector<uint64_t> seeds =
      RowSeeds(params, prompts.size(), generator, model->OutputWeight().device());

  // A row with no budget returns at once, empty and truncated; the others
  // get a slot each, consecutive equal prompts sharing one request.
  int64_t rows = 0, columns = 0;
  for (const std::vector<int64_t>& prompt : prompts) {
    const int64_t budget = Budget(params, prompt, config);
    if (budget < 1) continue;
    ++rows;
    columns = std::max(columns, static_cast<int64_t>(prompt.size()) + budget - 1);
  }
  for (SampledSequence& result : results) result.truncated = true;
  if (rows == 0) return results;
  DecodeEngine engine(DecodeEngineOptions{rows, columns});
  // `model` outlives the engine: a non-owning pointer.
  const std::shared_ptr<Decoder> shared(&model, [](Decoder*) {});
  for (size_t b = 0; b < prompts.size();) {
    size_t end = b + 1;
    while (end < prompts.size() && prompts[end] == prompts[b]) ++end;
    if (Budget(params, prompts[b], config) >= 1) {
      DecodeRequest request;
      request.id = b;  // the first row of the run
      request.model = shared;
      request.prompt = prompts[b];
      request.num_samples = static_cast<int64_t>(end - b);
      request.max_new_tokens = params.max_new_tokens;
      request.sampling = params.token_sampling();
      request.stop_token_ids = params.stop_token_ids;
      request.row_seeds.assign(seeds.begin() + static_cast<std::ptrdiff_t>(b),
                               seeds.begin() + static_cast<std::ptrdiff_t>(end));
      engine.Add(std::move(request));
    }
    b = end;
  }
  while (!engine.Idle()) {
    if (params.should_stop && params.should_stop()) break;
    for (DecodeResult& result : engine.Step()) {
      for (size_t g = 0; g < result.samples.size(); ++g) {
        results[result.id + g] = std::move(result.samples[g]);
      }
    }
  }
  return results;
}

}  // namespace kappa::model
