#include "model/token_sampler.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "base/stable_hash.h"

namespace kappa::model {
namespace {

// A [R, 1] float64 column of one setting per row.
template <typename Get>
torch::Tensor Column(const std::vector<TokenSampling>& rows, const c10::Device& device, Get get) {
  std::vector<double> values;
  values.reserve(rows.size());
  for (const TokenSampling& row : rows) values.push_back(static_cast<double>(get(row)));
  return torch::tensor(values, torch::kFloat64).to(device).unsqueeze(1);
}

bool Greedy(const TokenSampling& row) { return row.temperature == 0; }

// Which tokens each sampling row keeps: top-k, then top-p over what top-k
// left (renormalized), then min-p. probs: [R, W] float64.
torch::Tensor KeptTokens(const torch::Tensor& probs, const std::vector<TokenSampling>& rows) {
  const auto device = probs.device();
  const int64_t width = probs.size(1);
  auto keep = probs.gt(0);
  int64_t max_k = 0;
  bool any_top_p = false, any_min_p = false;
  for (const TokenSampling& row : rows) {
    if (row.top_k > 0 && row.top_k < width) max_k = std::max(max_k, row.top_k);
    any_top_p = any_top_p || row.top_p < 1;
    any_min_p = any_min_p || row.min_p > 0;
  }
  if (max_k > 0) {
    // The k-th largest probability of each row; rows without top-k keep all.
    auto kth_index = Column(rows, device, [width](const TokenSampling& r) {
                       return r.top_k > 0 && r.top_k < width ? r.top_k - 1 : 0;
                     }).to(torch::kLong);
    auto kth = std::get<0>(probs.topk(max_k, -1)).gather(1, kth_index.clamp_max(max_k - 1));
    auto active = Column(rows, device, [width](const TokenSampling& r) {
      return r.top_k > 0 && r.top_k < width ? 1.0 : 0.0;
    });
    keep = keep.logical_and(probs.ge(kth * active));
  }
  if (any_top_p) {
    auto kept = probs * keep;
    kept = kept / kept.sum(-1, true);
    auto sorted = std::get<0>(kept.sort(-1, /*descending=*/true));
    // The smallest prefix whose mass reaches top_p: tokens with mass strictly
    // before them below top_p (the first token always).
    auto before = sorted.cumsum(-1) - sorted;
    auto top_p = Column(rows, device, [](const TokenSampling& r) { return r.top_p; });
    auto count = before.lt(top_p).sum(-1, true).clamp_min(1);
    auto threshold = sorted.gather(1, count - 1);
    auto active = top_p.lt(1).to(torch::kFloat64);
    keep = keep.logical_and(kept.ge(threshold * active));
  }
  if (any_min_p) {
    auto min_p = Column(rows, device, [](const TokenSampling& r) { return r.min_p; });
    keep = keep.logical_and(probs.ge(std::get<0>(probs.max(-1, true)) * min_p));
  }
  return keep;
}

}  // namespace

uint64_t RowSeed(uint64_t request_seed, int64_t row) {
  using base::SplitMix64;
  return SplitMix64(request_seed ^ SplitMix64(static_cast<uint64_t>(row)));
}

void ValidateTokenSampling(const TokenSampling& sampling, int64_t vocab_size) {
  if (!(sampling.temperature >= 0)) {
    throw std::invalid_argument("sampling: temperature must be >= 0, got " +
                                std::to_string(sampling.temperature));
  }
  if (!(sampling.top_p > 0) || sampling.top_p > 1) {
    throw std::invalid_argument("sampling: top_p must be in (0, 1], got " +
                                std::to_string(sampling.top_p));
  }
  if (sampling.top_k < 0) {
    throw std::invalid_argument("sampling: top_k must be >= 0, got " +
                                std::to_string(sampling.top_k));
  }
  if (!(sampling.min_p >= 0) || sampling.min_p > 1) {
    throw std::invalid_argument("sampling: min_p must be in [0, 1], got " +
                                std::to_string(sampling.min_p));
  }
  if (sampling.sampleable_vocab_size < 1 || sampling.sampleable_vocab_size > vocab_size) {
    throw std::invalid_argument("sampling: sampleable_vocab_size " +
                                std::to_string(sampling.sampleable_vocab_size) +
                                " is outside [1, " + std::to_string(vocab_size) + "]");
  }
}

SampledTokens SampleTokens(const torch::Tensor& logits, const std::vector<TokenSampling>& rows,
                           const std::vector<double>& uniforms) {
  const int64_t R = logits.size(0);
  if (logits.dim() != 2 || static_cast<int64_t>(rows.size()) != R ||
      static_cast<int64_t>(uniforms.size()) != R) {
    throw std::invalid_argument("SampleTokens: logits [R, V] with R settings and R uniforms");
  }
  for (const TokenSampling& row : rows) ValidateTokenSampling(row, logits.size(1));  // REQUIRES
  SampledTokens out;
  if (R == 0) return out;
  torch::NoGradGuard no_grad;
  const auto device = logits.device();
  int64_t width = 0;
  bool ragged = false, any_sampled = false, any_greedy = false;
  for (const TokenSampling& row : rows) {
    if (width != 0 && row.sampleable_vocab_size != width) ragged = true;
    width = std::max(width, row.sampleable_vocab_size);
    any_sampled = any_sampled || !Greedy(row);
    any_greedy = any_greedy || Greedy(row);
  }
  // Ids at and above a row's sampleable size get no probability.
  auto z = logits.narrow(1, 0, width).to(torch::kFloat32);
  if (ragged) {
    auto limit =
        Column(rows, device, [](const TokenSampling& r) { return r.sampleable_vocab_size; });
    auto ids = torch::arange(width, torch::TensorOptions().dtype(torch::kFloat64).device(device));
    z = z.masked_fill(ids.unsqueeze(0).ge(limit), -std::numeric_limits<float>::infinity());
  }
  auto temperature = Column(rows, device, [](const TokenSampling& r) {
                       return Greedy(r) ? 1.0 : r.temperature;
                     }).to(torch::kFloat32);
  auto scaled = z / temperature;
  // log p(token) = scaled − logsumexp(scaled): the [R, W] log-softmax is
  // never materialized (a sampling step's cost is a few passes over it).
  auto log_normalizer = scaled.logsumexp(-1);

  torch::Tensor tokens;
  if (any_greedy) tokens = scaled.argmax(-1);
  if (any_sampled) {
    auto probs = torch::softmax(scaled, -1);
    bool filtered = false;
    for (const TokenSampling& row : rows) {
      filtered = filtered || row.min_p > 0 || row.top_p < 1 || (row.top_k > 0 && row.top_k < width);
    }
    auto kept = filtered ? probs * KeptTokens(probs.to(torch::kFloat64), rows) : probs;
    // float32 mass, accumulated in double by cumsum on the CPU.
    auto cdf = kept.cumsum(-1);
    auto u = torch::tensor(uniforms, torch::kFloat64).to(device).unsqueeze(1);
    auto total = cdf.narrow(1, width - 1, 1);
    auto target = (u * total.to(torch::kFloat64)).to(cdf.scalar_type());
    // Rounded to float, u · total may reach total itself: stay below it.
    target = torch::minimum(target, torch::nextafter(total, torch::zeros_like(total)));
    // The first id whose cumulative mass exceeds the target: ids with no
    // kept mass never are (their cumulative mass equals the one before).
    auto drawn = torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true)
                     .squeeze(1)
                     .clamp_max(width - 1);
    if (any_greedy) {
      auto greedy = Column(rows, device, [](const TokenSampling& r) { return Greedy(r) ? 1 : 0; })
                        .squeeze(1)
                        .gt(0);
      tokens = torch::where(greedy, tokens, drawn);
    } else {
      tokens = drawn;
    }
  }
  auto token_logp = scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - log_normalizer;
  auto host_tokens = tokens.to(torch::kCPU, torch::kLong).contiguous();
  auto host_logp = token_logp.to(torch::kCPU, torch::kFloat32).contiguous();
  out.tokens.assign(host_tokens.data_ptr<int64_t>(), host_tokens.data_ptr<int64_t>() + R);
  out.logprobs.assign(host_logp.data_ptr<float>(), host_logp.data_ptr<float>() + R);
  return out;
}

}  // namespace kappa::model
