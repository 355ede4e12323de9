#include "model/transformer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "model/checkpoint.h"
#include "tests/model/test_models.h"

namespace kappa::model {
namespace {

using testing::MaxAbsDiff;
using testing::TinyDecoder;
using torch::indexing::Slice;

// Straightforward Llama forward written from the HF modeling code (explicit
// repeat_kv, rotate_half, causal mask), used as an oracle for the model's
// grouped-query and cached paths. tokens: [T].
torch::Tensor ReferenceLogits(Decoder& model, const torch::Tensor& tokens) {
  const auto& c = model->config();
  auto w = model->named_parameters();
  auto rms = [&](const torch::Tensor& x, const std::string& name) {
    return w[name] * (x * torch::rsqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps));
  };
  const int64_t T = tokens.size(0), H = c.num_attention_heads, KV = c.num_key_value_heads,
                hd = c.head_dim();
  auto inv_freq = 1.0 / torch::pow(c.rope_theta, torch::arange(0, hd, 2, torch::kFloat64) / hd);
  auto freqs = torch::outer(torch::arange(T, torch::kFloat64), inv_freq);
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos().to(torch::kFloat32), sin = emb.sin().to(torch::kFloat32);
  auto rotate_half = [&](const torch::Tensor& x) {
    return torch::cat({-x.index({"...", Slice(hd / 2)}), x.index({"...", Slice(0, hd / 2)})}, -1);
  };
  auto causal = torch::ones({T, T}, torch::kBool).tril();

  auto h = w["model.embed_tokens.weight"].index_select(0, tokens);  // [T, D]
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto x = rms(h, p + "input_layernorm.weight");
    auto q =
        torch::matmul(x, w[p + "self_attn.q_proj.weight"].t()).view({T, H, hd}).transpose(0, 1);
    auto k =
        torch::matmul(x, w[p + "self_attn.k_proj.weight"].t()).view({T, KV, hd}).transpose(0, 1);
    auto v =
        torch::matmul(x, w[p + "self_attn.v_proj.weight"].t()).view({T, KV, hd}).transpose(0, 1);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    k = k.repeat_interleave(H / KV, 0);
    v = v.repeat_interleave(H / KV, 0);
    auto scores = torch::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(hd));
    scores = scores.masked_fill(causal.logical_not(), -INFINITY);
    auto attn = torch::matmul(torch::softmax(scores, -1), v).transpose(0, 1).reshape({T, H * hd});
    h = h + torch::matmul(attn, w[p + "self_attn.o_proj.weight"].t());
    x = rms(h, p + "post_attention_layernorm.weight");
    auto gate = torch::silu(torch::matmul(x, w[p + "mlp.gate_proj.weight"].t()));
    auto up = torch::matmul(x, w[p + "mlp.up_proj.weight"].t());
    h = h + torch::matmul(gate * up, w[p + "mlp.down_proj.weight"].t());
  }
  h = rms(h, "model.norm.weight");
  const auto& head = c.tie_word_embeddings ? w["model.embed_tokens.weight"] : w["lm_head.weight"];
  return torch::matmul(h, head.t());
}

class DecoderKvTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(DecoderKvTest, MatchesReferenceImplementation) {
  torch::NoGradGuard no_grad;
  Decoder model = TinyDecoder(GetParam());
  auto tokens = torch::randint(3, 21, {2, 12}, torch::kLong);
  auto out = model->Forward(tokens);
  EXPECT_EQ(out.logits.sizes(), (std::vector<int64_t>{2, 12, 21}));
  EXPECT_EQ(out.hidden.sizes(), (std::vector<int64_t>{2, 12, 32}));
  for (int64_t b = 0; b < 2; ++b) {
    auto ref = ReferenceLogits(model, tokens[b]);
    EXPECT_LT(MaxAbsDiff(out.logits[b], ref).item<float>(), 1e-4) << "row " << b;
  }
  // The test is only meaningful if the logits are far from uniform.
  EXPECT_GT(out.logits.std().item<float>(), 0.5);
}

TEST_P(DecoderKvTest, IncrementalDecodingMatchesFullForward) {
  torch::NoGradGuard no_grad;
  Decoder model = TinyDecoder(GetParam());
  auto tokens = torch::randint(3, 21, {3, 14}, torch::kLong);
  auto full = model->Forward(tokens).logits;

  // Prefill 5, then one token at a time.
  KVCache cache = model->NewCache(3, 14);
  std::vector<torch::Tensor> pieces{model->Forward(tokens.narrow(1, 0, 5), {}, {}, &cache).logits};
  for (int64_t t = 5; t < 14; ++t) {
    pieces.push_back(model->Forward(tokens.narrow(1, t, 1), {}, {}, &cache).logits);
  }
  EXPECT_EQ(cache.length, 14);
  EXPECT_LT(MaxAbsDiff(torch::cat(pieces, 1), full).item<float>(), 1e-5);

  // Uneven chunks through the same cache code path.
  KVCache chunked = model->NewCache(3, 20);
  auto a = model->Forward(tokens.narrow(1, 0, 3), {}, {}, &chunked).logits;
  auto b = model->Forward(tokens.narrow(1, 3, 7), {}, {}, &chunked).logits;
  auto c = model->Forward(tokens.narrow(1, 10, 4), {}, {}, &chunked).logits;
  EXPECT_LT(MaxAbsDiff(torch::cat({a, b, c}, 1), full).item<float>(), 1e-5);
}

TEST_P(DecoderKvTest, LeftPaddedRowsMatchUnpaddedForward) {
  torch::NoGradGuard no_grad;
  Decoder model = TinyDecoder(GetParam());
  const std::vector<int64_t> lengths = {9, 4, 1};
  const int64_t T = 9, extra = 5;
  std::vector<torch::Tensor> rows;
  auto tokens = torch::zeros({3, T}, torch::kLong);
  auto mask = torch::zeros({3, T}, torch::kLong);
  auto positions = torch::zeros({3, T}, torch::kLong);
  for (int64_t b = 0; b < 3; ++b) {
    rows.push_back(torch::randint(3, 21, {lengths[b] + extra}, torch::kLong));
    const int64_t pad = T - lengths[b];
    tokens.index_put_({b, Slice(pad)}, rows[b].narrow(0, 0, lengths[b]));
    mask.index_put_({b, Slice(pad)}, 1);
    positions.index_put_({b, Slice(pad)}, torch::arange(lengths[b]));
  }
  auto continuation = torch::stack(
      {rows[0].narrow(0, 9, extra), rows[1].narrow(0, 4, extra), rows[2].narrow(0, 1, extra)});

  // Without a cache: explicit positions and default (mask-derived) positions.
  for (bool explicit_positions : {true, false}) {
    auto out = model->Forward(tokens, mask, explicit_positions ? positions : torch::Tensor());
    EXPECT_TRUE(torch::isfinite(out.logits).all().item<bool>());
    for (int64_t b = 0; b < 3; ++b) {
      auto single = model->Forward(rows[b].narrow(0, 0, lengths[b]).unsqueeze(0)).logits[0];
      auto padded = out.logits[b].narrow(0, T - lengths[b], lengths[b]);
      EXPECT_LT(MaxAbsDiff(padded, single).item<float>(), 1e-5) << "row " << b;
    }
  }

  // With a cache: padded prefill, then decode the continuation token by token.
  KVCache cache = model->NewCache(3, T + extra);
  auto prefill = model->Forward(tokens, mask, positions, &cache).logits;
  std::vector<torch::Tensor> steps;
  for (int64_t k = 0; k < extra; ++k) {
    steps.push_back(model->Forward(continuation.narrow(1, k, 1), {}, {}, &cache).logits);
  }
  auto decoded = torch::cat(steps, 1);
  for (int64_t b = 0; b < 3; ++b) {
    auto single = model->Forward(rows[b].unsqueeze(0)).logits[0];
    auto got = torch::cat({prefill[b].narrow(0, T - lengths[b], lengths[b]), decoded[b]}, 0);
    EXPECT_LT(MaxAbsDiff(got, single).item<float>(), 1e-5) << "row " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(KvHeads, DecoderKvTest, ::testing::Values(4, 2, 1),
                         [](const auto& info) { return "kv" + std::to_string(info.param); });

TEST(DecoderTest, HuggingFaceParameterNames) {
  Decoder model = TinyDecoder();
  auto params = model->named_parameters();
  const auto& c = model->config();
  EXPECT_EQ(static_cast<int64_t>(params.size()), 2 + 9 * c.num_hidden_layers + 1);
  const std::vector<std::string> expected = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.1.post_attention_layernorm.weight",
      "model.layers.1.mlp.gate_proj.weight",
      "model.layers.1.mlp.up_proj.weight",
      "model.layers.1.mlp.down_proj.weight",
      "model.norm.weight",
      "lm_head.weight",
  };
  for (const auto& name : expected) EXPECT_NE(params.find(name), nullptr) << name;
  EXPECT_EQ(params["model.layers.0.self_attn.k_proj.weight"].sizes(),
            (std::vector<int64_t>{c.num_key_value_heads * c.head_dim(), c.hidden_size}));
  EXPECT_TRUE(torch::equal(params["model.norm.weight"], torch::ones({c.hidden_size})));
}

TEST(DecoderTest, InitFollowsHuggingFace) {
  torch::manual_seed(0);
  ModelConfig c = testing::TinyConfig();
  c.hidden_size = 128;
  c.intermediate_size = 256;
  Decoder model(c);
  auto w = model->named_parameters()["model.layers.0.mlp.up_proj.weight"];
  EXPECT_NEAR(w.std().item<float>(), 0.02, 0.002);
  EXPECT_NEAR(w.mean().item<float>(), 0.0, 0.002);
}

// Every parameter and buffer of `model` has `dtype`.
void ExpectAllOf(Decoder& model, torch::ScalarType dtype) {
  for (const auto& p : model->named_parameters())
    EXPECT_EQ(p.value().scalar_type(), dtype) << p.key();
  for (const auto& b : model->named_buffers()) EXPECT_EQ(b.value().scalar_type(), dtype) << b.key();
}

TEST(DecoderTest, APlacementBuildsTheModelThereAsConvertingItWould) {
  torch::NoGradGuard no_grad;
  const Placement bf16{torch::kCPU, torch::kBFloat16};
  const auto tokens = torch::randint(3, 21, {2, 7}, torch::kLong);
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    Decoder reference = TinyDecoder(4, tied);
    Decoder converted = CloneDecoder(reference);
    converted->to(torch::kBFloat16);

    // Built for weights to be written (LoadCheckpoint, a worker's copy).
    Decoder placed(reference->config(), /*random_init=*/false, bf16);
    ExpectAllOf(placed, torch::kBFloat16);
    EXPECT_EQ(placed->lm_head()->weight.scalar_type(), torch::kBFloat16);
    LoadWeights(placed, NamedWeights(reference));
    EXPECT_TRUE(torch::equal(placed->Forward(tokens).logits, converted->Forward(tokens).logits));

    // Randomly initialized: the default placement's values, rounded.
    torch::manual_seed(3);
    Decoder drawn(reference->config(), /*random_init=*/true, bf16);
    torch::manual_seed(3);
    Decoder drawn_then_converted(reference->config());
    drawn_then_converted->to(torch::kBFloat16);
    ExpectAllOf(drawn, torch::kBFloat16);
    const auto expected = drawn_then_converted->named_parameters();
    for (const auto& p : drawn->named_parameters()) {
      EXPECT_TRUE(torch::equal(p.value(), expected[p.key()])) << p.key();
    }
  }
}

TEST(DecoderTest, TiedEmbeddingsShareOneParameter) {
  Decoder model = TinyDecoder(4, /*tied=*/true);
  auto params = model->named_parameters();
  EXPECT_EQ(params.find("lm_head.weight"), nullptr);
  EXPECT_EQ(model->lm_head()->weight.data_ptr(), params["model.embed_tokens.weight"].data_ptr());
  auto tokens = torch::randint(3, 21, {1, 6}, torch::kLong);
  auto h = model->Forward(tokens).hidden;
  auto expected = torch::matmul(h, params["model.embed_tokens.weight"].t());
  EXPECT_LT(MaxAbsDiff(model->Forward(tokens).logits, expected).item<float>(), 1e-5);
  // Gradients reach the single shared matrix from both uses.
  model->Forward(tokens).logits.sum().backward();
  EXPECT_TRUE(params["model.embed_tokens.weight"].grad().defined());
}

TEST(DecoderTest, RopeDependsOnlyOnRelativePositions) {
  torch::NoGradGuard no_grad;
  Decoder model = TinyDecoder();
  auto tokens = torch::randint(3, 21, {1, 8}, torch::kLong);
  auto base = model->Forward(tokens).logits;
  auto shifted = model->Forward(tokens, {}, torch::arange(20, 28).unsqueeze(0)).logits;
  EXPECT_LT(MaxAbsDiff(base, shifted).item<float>(), 1e-4);
  // ...but the positions do matter when they are not a uniform shift.
  auto scrambled = model->Forward(tokens, {}, torch::tensor({{0, 3, 1, 7, 2, 9, 4, 5}})).logits;
  EXPECT_GT(MaxAbsDiff(base, scrambled).item<float>(), 1e-3);
}

TEST(DecoderTest, RejectsBadInputs) {
  torch::NoGradGuard no_grad;
  Decoder model = TinyDecoder();
  const int64_t max_pos = model->config().max_position_embeddings;
  EXPECT_THROW(model->Forward(torch::zeros({4}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(model->Forward(torch::zeros({1, max_pos + 1}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(model->Forward(torch::zeros({1, 3}, torch::kLong), torch::ones({1, 4})),
               std::invalid_argument);
  KVCache cache = model->NewCache(1, 4);
  model->Forward(torch::zeros({1, 3}, torch::kLong), {}, {}, &cache);
  EXPECT_THROW(model->Forward(torch::zeros({1, 2}, torch::kLong), {}, {}, &cache),
               std::invalid_argument);
  KVCache wrong_batch = model->NewCache(2, 4);
  EXPECT_THROW(model->Forward(torch::zeros({1, 2}, torch::kLong), {}, {}, &wrong_batch),
               std::invalid_argument);
}

// SetSparseEmbeddingGradient: the lookup's gradient is the T looked-up rows
// (sparse), its values the dense lookup's; added into a dense .grad in place.
TEST(DecoderTest, ASparseLookupGradientEqualsTheDenseOne) {
  for (bool tied : {false, true}) {
    Decoder dense = TinyDecoder(2, tied);
    Decoder sparse = CloneDecoder(dense);
    sparse->SetSparseEmbeddingGradient(true);
    EXPECT_TRUE(CloneDecoder(sparse)->sparse_embedding_gradient());
    auto tokens = torch::randint(3, 21, {2, 6}, torch::kLong);
    torch::Tensor w_dense = dense->named_parameters()["model.embed_tokens.weight"];
    torch::Tensor w_sparse = sparse->named_parameters()["model.embed_tokens.weight"];
    auto loss = [&](Decoder& m) { return m->Forward(tokens).logits.pow(2).mean(); };
    // What a caller that holds no .grad gets: untied, the lookup's own rows.
    const torch::Tensor g = torch::autograd::grad({loss(sparse)}, {w_sparse})[0];
    EXPECT_EQ(g.is_sparse(), !tied) << "tied " << tied;
    // The learner's way: .grad defined and dense before backward.
    w_sparse.mutable_grad() = torch::zeros_like(w_sparse);
    w_dense.mutable_grad() = torch::zeros_like(w_dense);
    loss(sparse).backward();
    loss(dense).backward();
    EXPECT_FALSE(w_sparse.grad().is_sparse());
    EXPECT_LT(MaxAbsDiff(w_sparse.grad(), w_dense.grad()).item<float>(), 1e-7) << "tied " << tied;
    EXPECT_LT(MaxAbsDiff(g.is_sparse() ? g.to_dense() : g, w_dense.grad()).item<float>(), 1e-7)
        << "tied " << tied;
  }
}

TEST(DecoderTest, CloneIsDeepAndIdentical) {
  torch::NoGradGuard no_grad;
  Decoder model = TinyDecoder(2);
  Decoder copy = CloneDecoder(model);
  auto tokens = torch::randint(3, 21, {2, 7}, torch::kLong);
  EXPECT_TRUE(torch::equal(model->Forward(tokens).logits, copy->Forward(tokens).logits));
  copy->named_parameters()["model.norm.weight"].fill_(2.0);
  EXPECT_TRUE(torch::equal(model->named_parameters()["model.norm.weight"],
                           torch::ones({model->config().hidden_size})));
}

}  // namespace
}  // namespace kappa::model
