#include "model/sampling.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

#include "model/token_sampler.h"

namespace kappa::model {
namespace {

// Draws one token per row from softmax(scaled_logits) restricted to the
// smallest set of tokens whose probability mass reaches top_p (the most
// likely token is always kept). scaled_logits: [B, V] fp32.
torch::Tensor SampleTopP(const torch::Tensor& scaled_logits, double top_p,
                         const c10::optional<at::Generator>& generator) {
  auto probs = torch::softmax(scaled_logits, -1);
  if (top_p < 1.0) {
    auto sorted = probs.sort(/*dim=*/-1, /*descending=*/true);
    auto sorted_probs = std::get<0>(sorted);
    auto sorted_idx = std::get<1>(sorted);
    // Mass strictly before each token; drop tokens already past top_p.
    auto before = sorted_probs.cumsum(-1) - sorted_probs;
    auto kept = sorted_probs.masked_fill(before >= top_p, 0.0);
    kept.select(-1, 0).copy_(sorted_probs.select(-1, 0));
    auto choice = torch::multinomial(kept, 1, /*replacement=*/false, generator);
    return sorted_idx.gather(-1, choice).squeeze(-1);
  }
  return torch::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(-1);
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
  if (params.temperature < 0) throw std::invalid_argument("Sample: temperature must be >= 0");
  if (!(params.top_p > 0) || params.top_p > 1) {
    throw std::invalid_argument("Sample: top_p must be in (0, 1]");
  }
  if (params.max_new_tokens < 0) throw std::invalid_argument("Sample: max_new_tokens must be >= 0");
  const int64_t vocab_size = model->config().vocab_size;
  if (params.pad_id < 0 || params.pad_id >= vocab_size) {
    throw std::invalid_argument("Sample: pad_id " + std::to_string(params.pad_id) +
                                " is outside the vocabulary");
  }
  for (int64_t id : params.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      throw std::invalid_argument("Sample: stop id " + std::to_string(id) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                  ")");
    }
  }
  if (params.sampleable_vocab_size < 0 || params.sampleable_vocab_size > vocab_size) {
    throw std::invalid_argument("Sample: sampleable_vocab_size " +
                                std::to_string(params.sampleable_vocab_size) + " is outside [0, " +
                                std::to_string(vocab_size) + "]");
  }
  const int64_t sampleable =
      params.sampleable_vocab_size > 0 ? params.sampleable_vocab_size : vocab_size;
  const int64_t B = static_cast<int64_t>(prompts.size());
  if (!params.row_seeds.empty() && static_cast<int64_t>(params.row_seeds.size()) != B) {
    throw std::invalid_argument("Sample: " + std::to_string(params.row_seeds.size()) +
                                " row_seeds for " + std::to_string(B) + " prompts");
  }
  TokenSampling row_sampling;
  row_sampling.temperature = params.temperature;
  row_sampling.top_p = params.top_p;
  row_sampling.top_k = params.top_k;
  row_sampling.min_p = params.min_p;
  row_sampling.sampleable_vocab_size = sampleable;
  ValidateTokenSampling(row_sampling, vocab_size);
  const bool per_row = !params.row_seeds.empty() || params.top_k > 0 || params.min_p > 0;
  std::vector<RowRandom> row_random;
  for (uint64_t seed : params.row_seeds) row_random.emplace_back(seed);
  std::vector<SampledSequence> results(prompts.size());
  if (B == 0) return results;

  const auto& config = model->config();
  const int64_t max_pos = config.max_position_embeddings;
  int64_t max_len = 0;
  std::vector<int64_t> lengths(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    if (n == 0) throw std::invalid_argument("Sample: prompt " + std::to_string(i) + " is empty");
    if (n > max_pos) {
      throw std::invalid_argument("Sample: prompt " + std::to_string(i) + " has " +
                                  std::to_string(n) + " tokens, more than max_position_embeddings " +
                                  std::to_string(max_pos));
    }
    for (int64_t t : prompts[i]) {
      if (t < 0 || t >= config.vocab_size) {
        throw std::invalid_argument("Sample: prompt " + std::to_string(i) + " has token id " +
                                    std::to_string(t) + " outside the vocabulary");
      }
    }
    lengths[i] = n;
    max_len = std::max(max_len, n);
  }
  // A row's whole sequence (prompt + response) stays within the position
  // table, so each row gets its own budget.
  std::vector<int64_t> budgets(prompts.size());
  int64_t steps = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    budgets[i] = std::min(params.max_new_tokens, max_pos - lengths[i]);
    steps = std::max(steps, budgets[i]);
    results[i].truncated = budgets[i] == 0;  // no room: at its budget before any token
  }
  if (steps == 0) return results;

  torch::NoGradGuard no_grad;
  const auto device = model->named_parameters().front().value().device();
  auto long_opts = torch::TensorOptions().dtype(torch::kLong);

  // Left padding keeps every row's last prompt token in the last column.
  auto tokens = torch::full({B, max_len}, params.pad_id, long_opts);
  auto mask = torch::zeros({B, max_len}, long_opts);
  auto positions = torch::zeros({B, max_len}, long_opts);
  {
    auto tok_a = tokens.accessor<int64_t, 2>();
    auto mask_a = mask.accessor<int64_t, 2>();
    auto pos_a = positions.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t pad = max_len - lengths[static_cast<size_t>(b)];
      for (int64_t t = 0; t < lengths[static_cast<size_t>(b)]; ++t) {
        tok_a[b][pad + t] = prompts[static_cast<size_t>(b)][static_cast<size_t>(t)];
        mask_a[b][pad + t] = 1;
        pos_a[b][pad + t] = t;
      }
    }
  }
  auto lengths_t = torch::tensor(lengths, long_opts).to(device);
  auto budgets_t = torch::tensor(budgets, long_opts).to(device);

  // The last sampled token is never fed back, hence steps - 1.
  KVCache cache = model->NewCache(B, max_len + steps - 1);
  auto out = model->Forward(tokens.to(device), mask.to(device), positions.to(device), &cache);
  auto logits = out.logits.select(1, max_len - 1);

  const c10::optional<at::Generator> gen =
      generator ? c10::optional<at::Generator>(*generator) : c10::nullopt;
  const bool greedy = params.temperature == 0;
  const double temperature = greedy ? 1.0 : params.temperature;
  auto finished = budgets_t.le(0);
  auto stopped = torch::zeros_like(finished);  // rows that sampled a stop id
  std::vector<torch::Tensor> step_tokens, step_logprobs, step_active;
  for (int64_t k = 0; k < steps; ++k) {
    // Padded rows (ids >= sampleable) get no probability: dropping them is
    // -inf logits without the [B, V] fill.
    auto real = sampleable < vocab_size ? logits.narrow(-1, 0, sampleable) : logits;
    auto scaled = real.to(torch::kFloat32) / temperature;
    auto logp = torch::log_softmax(scaled, -1);
    torch::Tensor next;
    if (per_row && !greedy) {
      std::vector<double> uniforms;
      if (!row_random.empty()) {
        for (RowRandom& random : row_random) uniforms.push_back(random.NextUniform());
      } else {
        auto drawn =
            torch::rand({B}, gen, torch::TensorOptions().dtype(torch::kFloat64).device(device))
                .cpu();
        uniforms.assign(drawn.data_ptr<double>(), drawn.data_ptr<double>() + B);
      }
      const SampledTokens sampled = SampleTokens(
          logits, std::vector<TokenSampling>(static_cast<size_t>(B), row_sampling), uniforms);
      next = torch::tensor(sampled.tokens, long_opts).to(device);
    } else {
      next = greedy ? scaled.argmax(-1) : SampleTopP(scaled, params.top_p, gen);
    }
    auto active = finished.logical_not();
    step_tokens.push_back(next);
    step_logprobs.push_back(logp.gather(-1, next.unsqueeze(-1)).squeeze(-1));
    step_active.push_back(active);
    auto is_stop = torch::zeros_like(finished);
    for (int64_t id : params.stop_token_ids) is_stop = is_stop.logical_or(next.eq(id));
    stopped = stopped.logical_or(active.logical_and(is_stop));
    finished = finished.logical_or(is_stop).logical_or(budgets_t.le(k + 1));
    if (k + 1 == steps || finished.all().item<bool>()) break;
    // Finished rows keep riding along as masked padding.
    auto feed = torch::where(finished, torch::full_like(next, params.pad_id), next);
    auto feed_pos = (lengths_t + k).clamp_max(max_pos - 1);
    out = model->Forward(feed.unsqueeze(1), finished.logical_not().unsqueeze(1),
                         feed_pos.unsqueeze(1), &cache);
    logits = out.logits.select(1, 0);
  }

  auto all_tokens = torch::stack(step_tokens, 1).cpu();
  auto all_logprobs = torch::stack(step_logprobs, 1).cpu();
  auto all_active = torch::stack(step_active, 1).cpu();
  auto all_stopped = stopped.cpu();
  auto tok_a = all_tokens.accessor<int64_t, 2>();
  auto lp_a = all_logprobs.accessor<float, 2>();
  auto act_a = all_active.accessor<bool, 2>();
  auto stop_a = all_stopped.accessor<bool, 1>();
  for (int64_t b = 0; b < B; ++b) {
    auto& seq = results[static_cast<size_t>(b)];
    // Every row ended at a stop id or at its budget (steps covers the largest).
    seq.truncated = !stop_a[b];
    for (int64_t k = 0; k < all_tokens.size(1) && act_a[b][k]; ++k) {
      seq.tokens.push_back(tok_a[b][k]);
      seq.logprobs.push_back(lp_a[b][k]);
    }
  }
  return results;
}

}  // namespace kappa::model
