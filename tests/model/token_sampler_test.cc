#include "model/token_sampler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

namespace kappa::model {
namespace {

// The distribution a row samples from, written out the way Hugging Face's
// generate filters (temperature, top-k, top-p over the renormalized rest,
// min-p), in float64 with a plain sort: an independent statement of the
// semantics, not the tensor code under test.
std::vector<double> ExpectedDistribution(const std::vector<double>& logits,
                                         const TokenSampling& s) {
  const size_t n = static_cast<size_t>(s.sampleable_vocab_size);
  std::vector<double> p(n);
  double max_z = -1e300;
  for (size_t i = 0; i < n; ++i) max_z = std::max(max_z, logits[i] / s.temperature);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += p[i] = std::exp(logits[i] / s.temperature - max_z);
  for (double& x : p) x /= total;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  std::vector<bool> keep(n, true);
  if (s.top_k > 0 && static_cast<size_t>(s.top_k) < n) {
    for (size_t r = static_cast<size_t>(s.top_k); r < n; ++r) keep[order[r]] = false;
  }
  if (s.top_p < 1) {
    double kept_mass = 0;
    for (size_t i = 0; i < n; ++i) kept_mass += keep[i] ? p[i] : 0;
    double before = 0;
    for (size_t i : order) {
      if (!keep[i]) continue;
      if (before >= s.top_p) keep[i] = false;
      before += p[i] / kept_mass;
    }
  }
  if (s.min_p > 0) {
    const double top = p[order[0]];
    for (size_t i = 0; i < n; ++i) keep[i] = keep[i] && p[i] >= s.min_p * top;
  }
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += keep[i] ? p[i] : 0;
  std::vector<double> q(logits.size(), 0.0);
  for (size_t i = 0; i < n; ++i) q[i] = keep[i] ? p[i] / kept : 0;
  return q;
}

// How often each token is drawn when u sweeps [0, 1) on an even grid: the
// inverse CDF makes each frequency its probability to within 2/N.
std::vector<double> GridFrequencies(const std::vector<double>& logits, const TokenSampling& s,
                                    int64_t n) {
  const auto row = torch::tensor(logits, torch::kFloat32).unsqueeze(0).expand({n, -1});
  std::vector<double> uniforms;
  for (int64_t i = 0; i < n; ++i) uniforms.push_back((static_cast<double>(i) + 0.5) / n);
  const SampledTokens drawn = SampleTokens(row, std::vector<TokenSampling>(n, s), uniforms);
  std::vector<double> frequency(logits.size(), 0.0);
  for (int64_t t : drawn.tokens) frequency[static_cast<size_t>(t)] += 1.0 / n;
  return frequency;
}

const std::vector<double> kLogits = {2.0, 1.5, 1.4, 0.2, -0.3, -1.0, -2.5, 0.9};

TEST(TokenSamplerTest, EachFilterSamplesItsDistribution) {
  struct Case {
    double temperature, top_p;
    int64_t top_k;
    double min_p;
  };
  for (const Case& c : std::vector<Case>{{1.0, 1.0, 0, 0.0},
                                         {0.7, 1.0, 0, 0.0},
                                         {1.0, 1.0, 3, 0.0},
                                         {1.0, 0.8, 0, 0.0},
                                         {1.3, 1.0, 0, 0.2},
                                         {0.9, 0.9, 5, 0.1},
                                         {1.0, 0.05, 0, 0.0}}) {
    TokenSampling s{c.temperature, c.top_p, c.top_k, c.min_p, 8};
    const std::vector<double> expected = ExpectedDistribution(kLogits, s);
    const std::vector<double> got = GridFrequencies(kLogits, s, 4000);
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(got[i], expected[i], 2.0 / 4000)
          << "token " << i << " τ=" << c.temperature << " top_p=" << c.top_p << " top_k=" << c.top_k
          << " min_p=" << c.min_p;
      if (expected[i] == 0) {
        EXPECT_EQ(got[i], 0) << "a filtered token was drawn: " << i;
      }
    }
  }
}

TEST(TokenSamplerTest, LogprobIsTheUntruncatedTemperedDistribution) {
  TokenSampling s{0.6, 0.5, 2, 0.3, 8};
  const auto row = torch::tensor(kLogits, torch::kFloat32).unsqueeze(0);
  const SampledTokens drawn = SampleTokens(row, {s}, {0.42});
  const auto logp = torch::log_softmax(row / 0.6, -1)[0][drawn.tokens[0]].item<float>();
  EXPECT_FLOAT_EQ(drawn.logprobs[0], logp);
  // Greedy: the argmax, at temperature 1.
  const SampledTokens greedy = SampleTokens(row, {TokenSampling{0.0, 1.0, 0, 0.0, 8}}, {0.99});
  EXPECT_EQ(greedy.tokens[0], 0);
  EXPECT_FLOAT_EQ(greedy.logprobs[0], torch::log_softmax(row, -1)[0][0].item<float>());
}

TEST(TokenSamplerTest, ARowDrawsTheSameWhateverItIsBatchedWith) {
  torch::manual_seed(3);
  const auto logits = torch::randn({5, 40}) * 3;
  const std::vector<TokenSampling> settings = {{1.0, 1.0, 0, 0.0, 40},
                                               {0.0, 1.0, 0, 0.0, 40},
                                               {0.8, 0.9, 0, 0.0, 30},
                                               {1.2, 1.0, 7, 0.0, 40},
                                               {0.5, 0.95, 3, 0.05, 25}};
  const std::vector<double> uniforms = {0.11, 0.5, 0.73, 0.99, 0.02};
  const SampledTokens together = SampleTokens(logits, settings, uniforms);
  for (int64_t r = 0; r < 5; ++r) {
    const SampledTokens alone =
        SampleTokens(logits.narrow(0, r, 1), {settings[static_cast<size_t>(r)]},
                     {uniforms[static_cast<size_t>(r)]});
    EXPECT_EQ(alone.tokens[0], together.tokens[static_cast<size_t>(r)]) << "row " << r;
    EXPECT_NEAR(alone.logprobs[0], together.logprobs[static_cast<size_t>(r)], 1e-5) << "row " << r;
    EXPECT_LT(together.tokens[static_cast<size_t>(r)],
              settings[static_cast<size_t>(r)].sampleable_vocab_size);
  }
}

TEST(TokenSamplerTest, IdsAboveARowsLimitAreNeverDrawn) {
  // The largest logits sit above the limit of row 0 only.
  auto logits = torch::zeros({2, 10});
  logits.narrow(1, 6, 4).fill_(5.0);
  std::vector<double> uniforms;
  for (int i = 0; i < 50; ++i) uniforms.push_back((i + 0.5) / 50);
  for (double u : uniforms) {
    const SampledTokens drawn = SampleTokens(
        logits, {TokenSampling{1.0, 1.0, 0, 0.0, 6}, TokenSampling{1.0, 1.0, 0, 0.0, 10}}, {u, u});
    EXPECT_LT(drawn.tokens[0], 6);
    EXPECT_FLOAT_EQ(drawn.logprobs[0], std::log(1.0f / 6));
  }
}

TEST(TokenSamplerTest, RowStreamsAreSeededAndDistinct) {
  RowRandom a(RowSeed(9, 0)), b(RowSeed(9, 0)), c(RowSeed(9, 1)), d(RowSeed(10, 0));
  std::set<double> seen;
  for (int i = 0; i < 100; ++i) {
    const double x = a.NextUniform();
    EXPECT_EQ(x, b.NextUniform());
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    seen.insert(x);
    seen.insert(c.NextUniform());
    seen.insert(d.NextUniform());
  }
  EXPECT_EQ(seen.size(), 300u);
}

TEST(TokenSamplerTest, RefusesBadSettingsByName) {
  auto message = [](const TokenSampling& s) {
    try {
      ValidateTokenSampling(s, 10);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({-1.0, 1.0, 0, 0.0, 10}).find("temperature"), std::string::npos);
  EXPECT_NE(message({1.0, 0.0, 0, 0.0, 10}).find("top_p"), std::string::npos);
  EXPECT_NE(message({1.0, 1.0, -2, 0.0, 10}).find("top_k"), std::string::npos);
  EXPECT_NE(message({1.0, 1.0, 0, 1.5, 10}).find("min_p"), std::string::npos);
  EXPECT_NE(message({1.0, 1.0, 0, 0.0, 11}).find("sampleable_vocab_size"), std::string::npos);
  EXPECT_EQ(message({1.0, 1.0, 0, 0.0, 10}), "");
}

}  // namespace
}  // namespace kappa::model
