// model::Checkpoint and the decoder's activation checkpointing: the
// checkpointed forward gives the unchecked loss and gradients (one backward,
// two through a retained graph, autograd::grad per position, LoRA dropout),
// and the hidden-only forward composes with OutputWeight() into Forward's
// logits.
#include "model/activation_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "model/autocast_state.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/model/test_models.h"

namespace kappa::model {
namespace {

namespace F = torch::nn::functional;

// ---------------------------------------------------------------------------
// Checkpoint on its own.

TEST(CheckpointTest, RecomputesOncePerBackwardAndMatchesDirectGradients) {
  torch::manual_seed(1);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto b = torch::randn({4}, torch::requires_grad());
  auto x = torch::randn({3, 4}, torch::requires_grad());
  int calls = 0;
  auto fn = [&](const torch::Tensor& in) {
    ++calls;
    return torch::tanh(F::linear(in, w, b)) * in;
  };

  auto direct_out = fn(x);
  auto direct = torch::autograd::grad({direct_out.pow(2).sum()}, {x, w, b});
  calls = 0;

  auto out = Checkpoint(fn, x, {w, b});
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(torch::equal(out, direct_out));
  auto loss = out.pow(2).sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(torch::allclose(x.grad(), direct[0], 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(w.grad(), direct[1], 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(b.grad(), direct[2], 1e-6, 1e-7));
  // A second pass through the retained graph recomputes again and accumulates.
  loss.backward();
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(torch::allclose(w.grad(), 2 * direct[1], 1e-6, 1e-7));
  // The graph is freed now: a third pass is libtorch's error.
  EXPECT_THROW(loss.backward(), c10::Error);
}

// Under bf16 autocast the recomputation in backward runs under the
// forward's autocast state (issue 44 item 2): its projection is a bf16
// tensor, as in the forward, and the gradients are those of the plain bf16
// segment to bf16 tolerance.
TEST(CheckpointTest, RecomputesUnderTheForwardsAutocastState) {
  torch::manual_seed(4);
  auto w = torch::randn({16, 16}, torch::requires_grad());
  auto x = torch::randn({8, 16}, torch::requires_grad());
  std::vector<c10::ScalarType> projection_types;
  auto fn = [&](const torch::Tensor& in) {
    const torch::Tensor projected = F::linear(in, w);
    projection_types.push_back(projected.scalar_type());
    return torch::tanh(projected.to(torch::kFloat32));
  };
  std::vector<torch::Tensor> direct;
  torch::Tensor checkpointed;
  {
    AutocastScope bf16(torch::kCPU, AutocastState{true, torch::kBFloat16});
    const torch::Tensor out = fn(x);
    direct = torch::autograd::grad({out.square().sum()}, {x, w});
    projection_types.clear();
    checkpointed = Checkpoint(fn, x, {w});
  }
  // Outside the scope, as the learner's backward is: the recomputation must
  // re-enter the forward's state.
  checkpointed.square().sum().backward();
  ASSERT_EQ(projection_types.size(), 2u);
  EXPECT_EQ(projection_types[0], torch::kBFloat16) << "forward";
  EXPECT_EQ(projection_types[1], torch::kBFloat16) << "recomputation in backward";
  const auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>() <= 2e-2 * b.abs().max().item<double>();
  };
  EXPECT_TRUE(close(x.grad(), direct[0]));
  EXPECT_TRUE(close(w.grad(), direct[1]));
  EXPECT_FALSE(AutocastState::Current(torch::kCPU).enabled) << "the scope restored autocast off";
}

// A segment that draws a dropout mask (issue 53 item 4a): the
// recomputation in backward draws the forward's mask, so the gradients are
// those of the plain segment under the same seed, and the backward leaves
// the random stream where the plain backward (which draws nothing) does.
TEST(CheckpointTest, RecomputationReplaysTheForwardsDropoutMask) {
  torch::manual_seed(2);
  auto w = torch::randn({16, 16}, torch::requires_grad());
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto fn = [&](const torch::Tensor& in) {
    return torch::dropout(F::linear(in, w), 0.3, /*train=*/true);
  };

  // A draw between the forward and the backward, as a training step's
  // sampling may do: the recomputation must put the stream back after it.
  torch::manual_seed(3);
  const torch::Tensor direct_out = fn(x);
  const torch::Tensor direct_between = torch::rand({16});
  const auto direct = torch::autograd::grad({direct_out.square().sum()}, {x, w});
  const torch::Tensor direct_next = torch::rand({16});

  torch::manual_seed(3);
  const torch::Tensor out = Checkpoint(fn, x, {w});
  ASSERT_TRUE(torch::equal(out, direct_out)) << "the forward draws the same mask";
  ASSERT_TRUE(torch::equal(torch::rand({16}), direct_between));
  out.square().sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), direct[0], 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(w.grad(), direct[1], 1e-6, 1e-7));
  EXPECT_TRUE(torch::equal(torch::rand({16}), direct_next))
      << "the recomputation shifted the random stream";
}

TEST(CheckpointTest, OnlyWhatRequiresGradGetsAGradient) {
  auto frozen = torch::randn({4, 4});
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto x = torch::randn({2, 4});  // an input that does not require grad
  auto out = Checkpoint([&](const torch::Tensor& in) { return F::linear(in, w + frozen); }, x,
                        {frozen, w});
  ASSERT_TRUE(out.requires_grad());
  auto g = torch::autograd::grad({out.sum()}, {w});
  EXPECT_TRUE(torch::allclose(g[0], x.sum(0).expand({4, 4})));
  EXPECT_FALSE(frozen.grad().defined());
}

TEST(CheckpointTest, WithoutGradModeItIsThePlainCall) {
  torch::NoGradGuard no_grad;
  auto w = torch::randn({4, 4}, torch::requires_grad());
  int calls = 0;
  auto out = Checkpoint(
      [&](const torch::Tensor& in) {
        ++calls;
        return F::linear(in, w);
      },
      torch::randn({2, 4}), {w});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out.requires_grad());
}

TEST(CheckpointTest, RejectsBadArgumentsAndDoubleBackward) {
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto fn = [&](const torch::Tensor& in) { return F::linear(in, w).pow(2); };
  EXPECT_THROW(Checkpoint({}, torch::randn({2, 4}), {w}), std::invalid_argument);
  EXPECT_THROW(Checkpoint(fn, torch::Tensor(), {w}), std::invalid_argument);
  EXPECT_THROW(Checkpoint(fn, torch::randn({2, 4}), {w, torch::Tensor()}), std::invalid_argument);
  auto out = Checkpoint(fn, torch::randn({2, 4}), {w});
  EXPECT_THROW(torch::autograd::grad({out.sum()}, {w}, {}, /*retain_graph=*/true,
                                     /*create_graph=*/true),
               std::invalid_argument);
}

// ---------------------------------------------------------------------------
// The decoder.

struct Variant {
  Architecture architecture;
  bool tied;
  torch::Dtype dtype;
};

std::string Describe(const Variant& v) {
  return std::string(ModelType(v.architecture)) + (v.tied ? "_tied" : "_untied") +
         (v.dtype == torch::kFloat64 ? "_f64" : "_f32");
}
std::string VariantName(const ::testing::TestParamInfo<Variant>& info) {
  return Describe(info.param);
}
void PrintTo(const Variant& v, std::ostream* os) { *os << Describe(v); }

// Every parameter random (norm weights near 1, biases nonzero), so each one
// has a gradient worth comparing; GQA (2 KV heads for 4 query heads).
Decoder RandomDecoder(const Variant& v) {
  ModelConfig c = testing::TinyConfig(/*kv_heads=*/2, v.tied);
  c.architecture = v.architecture;
  c.attention_bias = true;
  c.mlp_bias = true;
  c.num_hidden_layers = 3;
  torch::manual_seed(11);
  Decoder model(c);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      if (p.key().find("norm") != std::string::npos) {
        p.value().uniform_(0.5, 1.5);
      } else {
        p.value().normal_(0.0, 0.3);
      }
    }
  }
  model->to(v.dtype);
  return model;
}

// Three rows: full, left-padded by 3, right-padded by 2.
struct Batch {
  torch::Tensor tokens;  // [3, 9]
  torch::Tensor mask;    // [3, 9] 1 = real
};

Batch PaddedBatch() {
  torch::manual_seed(5);
  Batch b;
  b.tokens = torch::randint(3, 21, {3, 9}, torch::kLong);
  b.mask = torch::ones({3, 9}, torch::kLong);
  b.mask.index_put_({1, torch::indexing::Slice(0, 3)}, 0);
  b.mask.index_put_({2, torch::indexing::Slice(7, 9)}, 0);
  b.tokens.masked_fill_(b.mask.logical_not(), 0);
  return b;
}

// Per-position log-probabilities of the next real token, [3, 8], and the
// mask of the positions where that is defined.
torch::Tensor NextTokenLogprobs(const torch::Tensor& logits, const Batch& b) {
  const int64_t T = b.tokens.size(1);
  auto logp = torch::log_softmax(logits.narrow(1, 0, T - 1), -1);
  return logp.gather(-1, b.tokens.narrow(1, 1, T - 1).unsqueeze(-1)).squeeze(-1);
}

torch::Tensor TargetMask(const Batch& b) {
  const int64_t T = b.tokens.size(1);
  return (b.mask.narrow(1, 0, T - 1) * b.mask.narrow(1, 1, T - 1)).to(torch::kFloat64);
}

torch::Tensor MeanNll(const torch::Tensor& logits, const Batch& b) {
  auto m = TargetMask(b).to(logits.scalar_type());
  return -(NextTokenLogprobs(logits, b) * m).sum() / m.sum();
}

// max |a - b| / max |b|, in float64.
double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  auto a64 = a.to(torch::kFloat64), b64 = b.to(torch::kFloat64);
  const double scale = b64.abs().max().item<double>();
  return (a64 - b64).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// Nodes of the autograd graph behind `t` whose name contains `what`.
int CountGraphNodes(const torch::Tensor& t, const std::string& what) {
  std::vector<torch::autograd::Node*> stack{t.grad_fn().get()};
  std::unordered_set<torch::autograd::Node*> seen;
  int count = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find(what) != std::string::npos) ++count;
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
  return count;
}

double Tolerance(torch::Dtype dtype) { return dtype == torch::kFloat64 ? 1e-12 : 1e-6; }

class ActivationCheckpointTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    plain_ = RandomDecoder(GetParam());
    checked_ = CloneDecoder(plain_);
    checked_->SetActivationCheckpointing(true);
    ASSERT_FALSE(plain_->activation_checkpointing());
    ASSERT_TRUE(checked_->activation_checkpointing());
    batch_ = PaddedBatch();
  }

  // Every parameter's .grad agrees between the two models (and is defined).
  void ExpectSameGrads(double tol) {
    auto checked = checked_->named_parameters();
    size_t compared = 0;
    for (const auto& p : plain_->named_parameters()) {
      SCOPED_TRACE(p.key());
      const torch::Tensor& want = p.value().grad();
      const torch::Tensor& got = checked[p.key()].grad();
      ASSERT_TRUE(want.defined());
      ASSERT_TRUE(got.defined());
      EXPECT_GT(want.abs().max().item<double>(), 0.0);
      EXPECT_LE(RelativeError(got, want), tol);
      ++compared;
    }
    EXPECT_EQ(compared, checked.size());
  }

  Decoder plain_{nullptr};
  Decoder checked_{nullptr};
  Batch batch_;
};

TEST_P(ActivationCheckpointTest, SameLossAndGradients) {
  const double tol = Tolerance(GetParam().dtype);
  auto loss_plain = MeanNll(plain_->Forward(batch_.tokens, batch_.mask).logits, batch_);
  auto loss_checked = MeanNll(checked_->Forward(batch_.tokens, batch_.mask).logits, batch_);
  // One checkpoint node per layer (else this test would compare the plain
  // path with itself).
  EXPECT_EQ(CountGraphNodes(loss_checked, "CheckpointFunction"), 3);
  EXPECT_EQ(CountGraphNodes(loss_plain, "CheckpointFunction"), 0);
  EXPECT_LE(RelativeError(loss_checked, loss_plain), tol);
  loss_plain.backward();
  loss_checked.backward();
  ExpectSameGrads(tol);
}

TEST_P(ActivationCheckpointTest, TwoBackwardsThroughARetainedGraph) {
  const double tol = Tolerance(GetParam().dtype);
  auto m = TargetMask(batch_);
  for (Decoder* model : {&plain_, &checked_}) {
    auto logits = (*model)->Forward(batch_.tokens, batch_.mask).logits;
    auto logp = NextTokenLogprobs(logits, batch_);
    auto mm = m.to(logp.scalar_type());
    // Two different losses through the same forward, as a learner mixing
    // objectives does.
    auto loss_a = -(logp * mm).sum() / mm.sum();
    auto loss_b = (logits.pow(2).mean(-1).narrow(1, 0, logp.size(1)) * mm).sum();
    loss_a.backward({}, /*retain_graph=*/true);
    loss_b.backward();
  }
  ExpectSameGrads(tol);
}

TEST_P(ActivationCheckpointTest, AutogradGradOfSinglePositions) {
  const double tol = Tolerance(GetParam().dtype);
  std::vector<torch::Tensor> plain_params = plain_->parameters();
  std::vector<torch::Tensor> checked_params = checked_->parameters();
  ASSERT_EQ(plain_params.size(), checked_params.size());
  auto logp_plain = NextTokenLogprobs(plain_->Forward(batch_.tokens, batch_.mask).logits, batch_);
  auto logp_checked =
      NextTokenLogprobs(checked_->Forward(batch_.tokens, batch_.mask).logits, batch_);
  // (row, position): a full row, the first real target of the left-padded
  // row, and the last one of the right-padded row.
  for (auto [row, t] : {std::pair<int64_t, int64_t>{0, 2}, {1, 3}, {2, 5}}) {
    SCOPED_TRACE("row " + std::to_string(row) + " position " + std::to_string(t));
    auto want = torch::autograd::grad({logp_plain[row][t]}, plain_params, {},
                                      /*retain_graph=*/true, /*create_graph=*/false,
                                      /*allow_unused=*/true);
    auto got = torch::autograd::grad({logp_checked[row][t]}, checked_params, {},
                                     /*retain_graph=*/true, /*create_graph=*/false,
                                     /*allow_unused=*/true);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].defined(), want[i].defined()) << "parameter " << i;
      if (want[i].defined()) {
        EXPECT_LE(RelativeError(got[i], want[i]), tol) << "parameter " << i;
      }
    }
  }
}

TEST_P(ActivationCheckpointTest, HiddenOnlyForwardAndOutputWeight) {
  const double tol = Tolerance(GetParam().dtype);
  for (Decoder* model : {&plain_, &checked_}) {
    SCOPED_TRACE((*model)->activation_checkpointing() ? "checkpointed" : "plain");
    ForwardOutput full = (*model)->Forward(batch_.tokens, batch_.mask);
    ForwardOutput hidden = (*model)->ForwardHidden(batch_.tokens, batch_.mask);
    EXPECT_FALSE(hidden.logits.defined());
    EXPECT_TRUE(torch::equal(hidden.hidden, full.hidden));
    torch::Tensor w = (*model)->OutputWeight();
    EXPECT_EQ(w.sizes(), (std::vector<int64_t>{21, 32}));
    EXPECT_TRUE(w.requires_grad());
    const std::string name = GetParam().tied ? "model.embed_tokens.weight" : "lm_head.weight";
    EXPECT_TRUE(w.is_same((*model)->named_parameters()[name]));
    EXPECT_TRUE(torch::equal(torch::matmul(hidden.hidden, w.t()), full.logits));
  }
  // A loss on logits projected in chunks of positions from the hidden-only
  // forward has the gradients of Forward's (the learner's path).
  auto loss_plain = MeanNll(plain_->Forward(batch_.tokens, batch_.mask).logits, batch_);
  auto h = checked_->ForwardHidden(batch_.tokens, batch_.mask).hidden;
  std::vector<torch::Tensor> chunks;
  for (int64_t t = 0; t < h.size(1); t += 4) {
    chunks.push_back(
        F::linear(h.narrow(1, t, std::min<int64_t>(4, h.size(1) - t)), checked_->OutputWeight()));
  }
  auto loss_checked = MeanNll(torch::cat(chunks, 1), batch_);
  EXPECT_LE(RelativeError(loss_checked, loss_plain), tol);
  loss_plain.backward();
  loss_checked.backward();
  ExpectSameGrads(10 * tol);  // the chunks sum W's gradient in another order
}

TEST_P(ActivationCheckpointTest, NoGradAndKvCacheForwardsAreUnchanged) {
  const Variant v = GetParam();
  // Grad mode on, but a cache: not checkpointed, and the same logits.
  KVCache cache_plain = plain_->NewCache(3, 9), cache_checked = checked_->NewCache(3, 9);
  auto a = plain_->Forward(batch_.tokens, batch_.mask, {}, &cache_plain).logits;
  auto b = checked_->Forward(batch_.tokens, batch_.mask, {}, &cache_checked).logits;
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_EQ(cache_checked.length, 9);
  torch::NoGradGuard no_grad;
  auto c = checked_->Forward(batch_.tokens, batch_.mask).logits;
  EXPECT_FALSE(c.requires_grad());
  EXPECT_LE(RelativeError(c, a), Tolerance(v.dtype));
}

TEST_P(ActivationCheckpointTest, DoubleBackwardIsRefused) {
  auto loss = MeanNll(checked_->Forward(batch_.tokens, batch_.mask).logits, batch_);
  std::vector<torch::Tensor> params = checked_->parameters();
  EXPECT_THROW(torch::autograd::grad({loss}, params, {}, /*retain_graph=*/true,
                                     /*create_graph=*/true, /*allow_unused=*/true),
               std::invalid_argument);
  // The unchecked model supports it: the refusal is the checkpoint's.
  auto plain_loss = MeanNll(plain_->Forward(batch_.tokens, batch_.mask).logits, batch_);
  std::vector<torch::Tensor> plain_params = plain_->parameters();
  EXPECT_NO_THROW(torch::autograd::grad({plain_loss}, plain_params, {}, /*retain_graph=*/true,
                                        /*create_graph=*/true, /*allow_unused=*/true));
}

INSTANTIATE_TEST_SUITE_P(Variants, ActivationCheckpointTest,
                         ::testing::Values(Variant{Architecture::kLlama, false, torch::kFloat32},
                                           Variant{Architecture::kLlama, true, torch::kFloat32},
                                           Variant{Architecture::kQwen2, false, torch::kFloat32},
                                           Variant{Architecture::kQwen3, true, torch::kFloat32},
                                           Variant{Architecture::kLlama, false, torch::kFloat64},
                                           Variant{Architecture::kQwen3, true, torch::kFloat64}),
                         VariantName);

// LoRA dropout with checkpointing (issue 53 item 4a): under the same seed,
// a checkpointed training step has the plain step's gradients, because each
// layer's recomputation draws the dropout masks its forward drew.
TEST(ActivationCheckpointLoraTest, DropoutMasksAreReplayedInTheRecomputation) {
  Decoder model = RandomDecoder(Variant{Architecture::kLlama, false, torch::kFloat32});
  LoraConfig lora;
  lora.rank = 4;
  lora.dropout = 0.3;
  lora.target_modules = LoraTargetNames();
  model->EnableLora(lora);
  {
    torch::NoGradGuard no_grad;  // B = 0 would make the forward blind to the masks
    for (auto& p : model->named_parameters()) {
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0.0, 0.3);
    }
  }
  model->train();
  const Batch batch = PaddedBatch();

  // Per parameter, its gradient of one seeded step.
  const auto step = [&](bool checkpointing) {
    model->SetActivationCheckpointing(checkpointing);
    model->zero_grad();
    torch::manual_seed(17);
    const torch::Tensor loss = MeanNll(model->Forward(batch.tokens, batch.mask).logits, batch);
    EXPECT_EQ(CountGraphNodes(loss, "CheckpointFunction"), checkpointing ? 3 : 0);
    loss.backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& p : model->named_parameters()) grads[p.key()] = p.value().grad().clone();
    return grads;
  };
  const std::map<std::string, torch::Tensor> checked = step(true);
  const std::map<std::string, torch::Tensor> plain = step(false);
  ASSERT_EQ(checked.size(), plain.size());
  for (const auto& [name, want] : plain) {
    SCOPED_TRACE(name);
    const torch::Tensor& got = checked.at(name);
    EXPECT_GT(want.abs().max().item<double>(), 0.0);
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-7))
        << "max |checked - plain| = " << (got - want).abs().max().item<double>();
  }
}

TEST(ActivationCheckpointCloneTest, CloneKeepsTheSetting) {
  Decoder model = testing::TinyDecoder();
  EXPECT_FALSE(model->activation_checkpointing());
  model->SetActivationCheckpointing(true);
  EXPECT_TRUE(CloneDecoder(model)->activation_checkpointing());
  model->SetActivationCheckpointing(false);
  EXPECT_FALSE(CloneDecoder(model)->activation_checkpointing());
}

}  // namespace
}  // namespace kappa::model
