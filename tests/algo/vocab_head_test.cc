// The chunked vocabulary head (trainer.vocab_chunk_positions) against the
// one-[B, L, V] path, the compact top-k teacher rows, and the tail-bucket
// loss topk_tail_reverse_kl against a reference built from its definition.
#include "learner/algo/vocab_head.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "learner/algo/distill_gate.h"
#include "learner/algo/hybrid_loss.h"
#include "learner/algo/hybrid_step.h"
#include "learner/algo/logit_gradients.h"
#include "learner/algo/logprob_losses.h"
#include "learner/algo/mixed_precision.h"
#include "learner/algo/train_batch.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::Grads;
using testing::RandomGroups;
using testing::TinyModel;
using testing::ZeroGrads;

constexpr int64_t kVocab = 16;  // TinyConfig's rows

// Compact top-k rows of each sample's full teacher row: its k most likely
// ids (in a shuffled order, so nothing relies on them being sorted), their
// log-probs, and a sent tail log-mass half a nat below the row's true one:
// a path that rebuilt the tail from the k values instead of reading the
// sent one would differ from the others.
std::vector<ScoredGroup> ToTopk(std::vector<ScoredGroup> groups, int64_t k) {
  for (ScoredGroup& g : groups) {
    for (ScoredSample& s : g.samples) {
      const auto [values, ids] = s.teacher_logprobs.topk(k, -1);
      const torch::Tensor order = torch::randperm(k, torch::kInt64);
      s.teacher_tail_logmass =
          (s.teacher_logprobs.scatter(-1, ids, -std::numeric_limits<float>::infinity())
               .logsumexp(-1) -
           0.5)
              .contiguous();
      s.teacher_topk_ids = ids.index_select(1, order).contiguous();
      s.teacher_logprobs = values.index_select(1, order).contiguous();
    }
  }
  return groups;
}

std::vector<ScoredGroup> ToSampled(std::vector<ScoredGroup> groups) {
  for (ScoredGroup& g : groups) {
    for (ScoredSample& s : g.samples) {
      const torch::Tensor y = torch::tensor(s.response_tokens, torch::kInt64);
      s.teacher_logprobs = s.teacher_logprobs.gather(1, y.unsqueeze(1)).squeeze(1).contiguous();
    }
  }
  return groups;
}

// TinyModel with 20 embedding rows for the 16 ids the batches use.
model::Decoder PaddedTinyModel(uint64_t seed) {
  torch::manual_seed(seed);
  model::ModelConfig config = testing::TinyConfig();
  config.vocab_size = kVocab + 4;
  model::Decoder m(config);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) {
    if (p.dim() == 2) p.mul_(25.0);
  }
  return m;
}

struct Case {
  std::string name;
  DistillLoss loss;
  std::string rows;  // full | sampled | topk
};

TrainBatch BatchFor(const Case& c, uint64_t seed) {
  std::vector<ScoredGroup> groups = RandomGroups(3, 2, /*with_teacher=*/true, seed);
  if (c.rows == "topk") groups = ToTopk(std::move(groups), 5);
  if (c.rows == "sampled") groups = ToSampled(std::move(groups));
  return BuildTrainBatch(groups, /*norm_std=*/true, /*pad_id=*/0);
}

struct Measured {
  double reward_loss = 0, distill_loss = 0, entropy = 0;
  std::vector<torch::Tensor> reward_grads, distill_grads;
  torch::Tensor token_logprobs, distill, entropy_per_position;  // at response positions
};

// The forward under `precision`'s autocast, the backward outside it, as the
// learner's step does.
Measured Measure(model::Decoder& m, const TrainBatch& batch, const LossConfig& config,
                 Precision precision = Precision::kFloat32) {
  Measured out;
  TokenTerms tokens;
  LossTerms terms;
  {
    const AutocastGuard autocast(torch::kCPU, precision);
    tokens = ComputeTokenTerms(m, batch, config);
    terms = AggregateTerms(tokens, batch, config);
  }
  const torch::Tensor at = batch.response_mask > 0;
  out.token_logprobs = tokens.token_logprobs.detach().masked_select(at);
  out.distill = tokens.distill.detach().masked_select(at);
  out.entropy_per_position = tokens.entropy.masked_select(at);
  out.reward_loss = terms.reward_loss.item<double>();
  out.distill_loss = terms.distill_loss.item<double>();
  out.entropy = terms.entropy;
  ZeroGrads(m);
  terms.reward_loss.backward({}, /*retain_graph=*/true);
  out.reward_grads = Grads(m);
  ZeroGrads(m);
  terms.distill_loss.backward();
  out.distill_grads = Grads(m);
  ZeroGrads(m);
  return out;
}

void ExpectClose(const torch::Tensor& a, const torch::Tensor& b, double tol,
                 const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double diff = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  const double scale = std::max(1.0, b.to(torch::kFloat64).abs().max().item<double>());
  EXPECT_LT(diff, tol * scale) << what;
}

void ExpectSame(const Measured& chunked, const Measured& whole, const std::string& what) {
  constexpr double kTol = 1e-5;
  EXPECT_NEAR(chunked.reward_loss, whole.reward_loss, kTol) << what;
  EXPECT_NEAR(chunked.distill_loss, whole.distill_loss, kTol * std::max(1.0, whole.distill_loss))
      << what;
  EXPECT_NEAR(chunked.entropy, whole.entropy, kTol) << what;
  ExpectClose(chunked.token_logprobs, whole.token_logprobs, kTol, what + " log p(y)");
  ExpectClose(chunked.distill, whole.distill, kTol, what + " ℓ_D");
  ExpectClose(chunked.entropy_per_position, whole.entropy_per_position, kTol, what + " H");
  ASSERT_EQ(chunked.reward_grads.size(), whole.reward_grads.size());
  for (size_t i = 0; i < whole.reward_grads.size(); ++i) {
    ExpectClose(chunked.reward_grads[i], whole.reward_grads[i], kTol,
                what + " ∇L_R param " + std::to_string(i));
    ExpectClose(chunked.distill_grads[i], whole.distill_grads[i], kTol,
                what + " ∇L_D param " + std::to_string(i));
  }
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"reverse_kl", DistillLoss::kReverseKl, "full"},
      {"forward_kl", DistillLoss::kForwardKl, "full"},
      {"sampled_reverse_kl/full", DistillLoss::kSampledReverseKl, "full"},
      {"sampled_reverse_kl/sampled", DistillLoss::kSampledReverseKl, "sampled"},
      {"topk_reverse_kl", DistillLoss::kTopkReverseKl, "topk"},
      {"topk_tail_reverse_kl", DistillLoss::kTopkTailReverseKl, "topk"},
  };
  return cases;
}

TEST(VocabHead, ChunkedTermsAndGradientsEqualTheWholeVocabularyPath) {
  for (const Case& c : Cases()) {
    for (const double temperature : {1.0, 0.7}) {
      // limit 16: a model with 4 padded embedding rows above the ids.
      for (const int64_t vocab_limit : {int64_t{0}, kVocab}) {
        model::Decoder m = vocab_limit == 0 ? TinyModel(3) : PaddedTinyModel(3);
        const TrainBatch batch = BatchFor(c, 11);
        LossConfig config;
        config.distill = c.loss;
        config.temperature = temperature;
        config.vocab_limit = vocab_limit;
        const Measured whole = Measure(m, batch, config);
        for (const int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{1000}}) {
          config.vocab_chunk_positions = chunk;
          const std::string what = c.name + " τ=" + std::to_string(temperature) +
                                   " limit=" + std::to_string(vocab_limit) +
                                   " chunk=" + std::to_string(chunk);
          ExpectSame(Measure(m, batch, config), whole, what);
        }
      }
    }
  }
}

// Under bf16 autocast the node's forward multiplies in bf16; its backward
// recomputes the logits under the same state and normalises them by their
// own logsumexp (issue 44 item 1). Before, it recomputed them in fp32 and
// divided by the bf16 forward's normaliser: on confident rows (logits ~20)
// the sampled token's gradient took the wrong sign.
TEST(VocabHead, UnderBf16AutocastTheChunkedHeadHasThePlainHeadsGradients) {
  model::Decoder m = TinyModel(3);
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = m->forward(torch::arange(3, 16).unsqueeze(0));
    m->OutputWeight().mul_(20.0 / logits.abs().max().item<double>());
  }
  for (const Case& c : Cases()) {
    const TrainBatch batch = BatchFor(c, 11);
    LossConfig config;
    config.distill = c.loss;
    const Measured whole = Measure(m, batch, config, Precision::kBFloat16);
    config.vocab_chunk_positions = 4;
    const Measured chunked = Measure(m, batch, config, Precision::kBFloat16);
    for (size_t i = 0; i < whole.reward_grads.size(); ++i) {
      ExpectClose(chunked.reward_grads[i], whole.reward_grads[i], 3e-2,
                  c.name + " bf16 ∇L_R param " + std::to_string(i));
      ExpectClose(chunked.distill_grads[i], whole.distill_grads[i], 3e-2,
                  c.name + " bf16 ∇L_D param " + std::to_string(i));
    }
  }
}

// One step of TinyModel(9) on `batch` with the logit K_DR estimator and
// the exact K_DR on 4 positions, the vocabulary in chunks of `chunk`
// positions (0: whole).
HybridStepReport KdrStep(const TrainBatch& batch, DistillLoss loss, int64_t chunk,
                         int64_t micro_batch, Precision precision) {
  model::Decoder m = TinyModel(9);
  HybridStepConfig config;
  config.precision = precision;
  config.loss.distill = loss;
  config.loss.vocab_chunk_positions = chunk;
  config.micro_batch_sequences = micro_batch;
  config.monitor.kdr_estimator = KdrEstimator::kLogit;
  config.monitor.kdr_exact_every = 1;
  config.monitor.kdr_exact_positions = 4;
  auto optimizer = std::make_unique<PolicyOptimizer>(m, 1e-6, 0.0, /*max_grad_norm=*/0.0);
  HybridStep step(m, std::move(optimizer), config);
  return step.Run(batch);
}

// Issue 44 item 1: each row of ∂L/∂s the node's backward forms sums to 0,
// for incoming gradients of log-probabilities, when s came out of a bfloat16
// GEMM (logits ~20, confident rows). The backward normalises p by the
// recomputed logits' own logsumexp; the saved bfloat16 one it used before
// leaves rows summing to g_lse (Σ p − 1), shown here too.
TEST(VocabHead, UnderBf16EveryRowOfTheChunkLogitGradientSumsToZero) {
  torch::manual_seed(44);
  const int64_t rows = 16, vocab = 2000, width = 64, k = 8;
  const torch::Tensor h = torch::randn({rows, width});
  const torch::Tensor w = torch::randn({vocab, width});
  torch::Tensor s =
      torch::matmul(h.to(torch::kBFloat16), w.to(torch::kBFloat16).t()).to(torch::kFloat32);
  s = s * (20.0 / s.abs().max().item<double>());   // the largest logit ~20
  s = s.to(torch::kBFloat16).to(torch::kFloat32);  // bfloat16 values, as the GEMM gives
  const torch::Tensor targets = torch::randint(vocab, {rows}, torch::kInt64);
  const torch::Tensor ids = std::get<1>(s.topk(k, -1));
  const torch::Tensor teacher = torch::log_softmax(3 * torch::randn({rows, vocab}), -1);
  VocabHeadOutputGrads g;
  g.target = torch::randn({rows});
  g.set = torch::randn({rows, k});
  g.lse = -(g.target + g.set.sum(-1));  // the outputs enter the loss as log-probs
  g.kl = torch::randn({rows});
  for (const bool reverse : {true, false}) {
    const torch::Tensor ds = VocabHeadChunkLogitGradient(s, g, targets, ids, teacher, reverse);
    const torch::Tensor row_sum = ds.to(torch::kFloat64).sum(-1).abs();
    const torch::Tensor row_norm = ds.to(torch::kFloat64).norm(2, -1);
    EXPECT_TRUE((row_sum <= 1e-5 * row_norm).all().item<bool>())
        << (reverse ? "reverse" : "forward")
        << " KL: worst |Σ ds| / ‖ds‖ = " << (row_sum / row_norm).max().item<double>();
  }
  // The saved normaliser of a bfloat16 forward (its logsumexp rounded to
  // bfloat16) against these logits: p no longer sums to 1.
  const torch::Tensor saved_lse = s.logsumexp(-1).to(torch::kBFloat16).to(torch::kFloat32);
  const torch::Tensor stale_p_sum = (s - saved_lse.unsqueeze(-1)).exp().sum(-1);
  EXPECT_GT((stale_p_sum - 1).abs().max().item<double>(), 1e-3)
      << "a stale normaliser no longer shows at this scale: the test lost its point";
}

// The SFT term and the exact K_DR under bf16: the chunked head gives the
// plain head's values and gradients to bfloat16 tolerance.
TEST(VocabHead, UnderBf16TheChunkedHeadHasThePlainHeadsSftGradientAndExactKdr) {
  std::vector<ScoredGroup> groups = RandomGroups(2, 2, /*with_teacher=*/true, 5);
  for (ScoredSample& s : groups[0].samples) s.reward = 0.0f;
  groups[0].teacher_demonstrations = {{5, 6, 7}, {8, 9}};
  const TrainBatch batch = BuildTrainBatch(groups, true, 0);
  std::vector<torch::Tensor> sft_grads[2];
  double sft_nll[2] = {0, 0};
  for (int chunked = 0; chunked < 2; ++chunked) {
    model::Decoder m = TinyModel(4);
    LossConfig config;
    config.vocab_chunk_positions = chunked ? 2 : 0;
    TokenTerms terms;
    {
      const AutocastGuard autocast(torch::kCPU, Precision::kBFloat16);
      terms = ComputeTokenTerms(m, batch, config);
    }
    ASSERT_TRUE(terms.sft_nll.defined());
    sft_nll[chunked] = terms.sft_nll.item<double>();
    ZeroGrads(m);
    terms.sft_nll.backward();
    sft_grads[chunked] = Grads(m);
  }
  EXPECT_NEAR(sft_nll[1], sft_nll[0], 3e-2 * std::max(1.0, std::abs(sft_nll[0])));
  for (size_t i = 0; i < sft_grads[0].size(); ++i) {
    ExpectClose(sft_grads[1][i], sft_grads[0][i], 3e-2, "bf16 ∇L_SFT param " + std::to_string(i));
  }

  for (const Case& c : Cases()) {
    if (c.rows == "sampled") continue;
    const TrainBatch kdr_batch = BatchFor(c, 17);
    const HybridStepReport reports[2] = {
        KdrStep(kdr_batch, c.loss, /*chunk=*/0, /*micro_batch=*/0, Precision::kBFloat16),
        KdrStep(kdr_batch, c.loss, /*chunk=*/4, /*micro_batch=*/0, Precision::kBFloat16)};
    ASSERT_TRUE(reports[0].kdr_exact && reports[1].kdr_exact) << c.name;
    EXPECT_NEAR(reports[1].kdr_exact->mean, reports[0].kdr_exact->mean,
                3e-2 * std::max(1.0, std::abs(reports[0].kdr_exact->mean)))
        << c.name << " bf16 exact K_DR";
  }
}

TEST(VocabHead, SftRowsThroughTheChunkedHeadEqualSftNll) {
  std::vector<ScoredGroup> groups = RandomGroups(2, 2, /*with_teacher=*/true, 5);
  for (ScoredSample& s : groups[0].samples) s.reward = 0.0f;
  groups[0].teacher_demonstrations = {{5, 6, 7}, {8, 9}};
  const TrainBatch batch = BuildTrainBatch(groups, true, 0);
  model::Decoder m = TinyModel(4);
  LossConfig config;
  const TokenTerms whole = ComputeTokenTerms(m, batch, config);
  config.vocab_chunk_positions = 2;
  const TokenTerms chunked = ComputeTokenTerms(m, batch, config);
  ASSERT_TRUE(chunked.sft_nll.defined());
  EXPECT_NEAR(chunked.sft_nll.item<double>(), whole.sft_nll.item<double>(), 1e-5);
  EXPECT_EQ(chunked.sft_count.item<double>(), whole.sft_count.item<double>());
}

// The whole step (gate, K_DR monitors, κ, update) is the same with the
// chunked head: the cheap kernels it reports come from VocabHeadLogitKernel.
TEST(VocabHead, HybridStepReportsTheSameKdrAndGradientNorms) {
  for (const Case& c : Cases()) {
    if (c.rows == "sampled") continue;
    const TrainBatch batch = BatchFor(c, 17);
    const HybridStepReport reports[2] = {
        KdrStep(batch, c.loss, /*chunk=*/0, /*micro_batch=*/4, Precision::kFloat32),
        KdrStep(batch, c.loss, /*chunk=*/4, /*micro_batch=*/4, Precision::kFloat32)};
    const HybridStepReport &whole = reports[0], &chunked = reports[1];
    ASSERT_TRUE(whole.kdr && chunked.kdr) << c.name;
    EXPECT_NEAR(chunked.kdr->mean, whole.kdr->mean, 1e-5 * std::max(1.0, std::abs(whole.kdr->mean)))
        << c.name;
    EXPECT_EQ(chunked.kdr->negative_fraction, whole.kdr->negative_fraction) << c.name;
    ASSERT_EQ(chunked.kdr_values.size(), whole.kdr_values.size());
    for (size_t i = 0; i < whole.kdr_values.size(); ++i) {
      EXPECT_NEAR(chunked.kdr_values[i], whole.kdr_values[i],
                  1e-5 * std::max(1.0f, std::abs(whole.kdr_values[i])))
          << c.name << " position " << i;
    }
    ASSERT_TRUE(whole.kdr_exact && chunked.kdr_exact) << c.name;
    EXPECT_NEAR(chunked.kdr_exact->mean, whole.kdr_exact->mean,
                1e-5 * std::max(1.0, std::abs(whole.kdr_exact->mean)))
        << c.name;
    EXPECT_NEAR(chunked.stats.reward_grad_norm, whole.stats.reward_grad_norm,
                1e-5 * whole.stats.reward_grad_norm)
        << c.name;
    EXPECT_NEAR(chunked.stats.distill_grad_norm, whole.stats.distill_grad_norm,
                1e-5 * whole.stats.distill_grad_norm)
        << c.name;
  }
}

// trainer.activation_checkpointing under the whole step: the two backward
// passes of κ and exact K_DR's per-position autograd::grad go through the
// recomputed layers and give what the stored activations give.
TEST(VocabHead, ActivationCheckpointingGivesTheSameStep) {
  const TrainBatch batch = BatchFor({"", DistillLoss::kTopkTailReverseKl, "topk"}, 21);
  HybridStepReport reports[2];
  for (int checkpointing = 0; checkpointing < 2; ++checkpointing) {
    model::Decoder m = TinyModel(9);
    m->SetActivationCheckpointing(checkpointing == 1);
    HybridStepConfig config;
    config.loss.distill = DistillLoss::kTopkTailReverseKl;
    config.loss.vocab_chunk_positions = 4;
    config.monitor.kdr_exact_every = 1;
    config.monitor.kdr_exact_positions = 4;
    auto optimizer = std::make_unique<PolicyOptimizer>(m, 1e-6, 0.0, /*max_grad_norm=*/0.0);
    HybridStep step(m, std::move(optimizer), config);
    reports[checkpointing] = step.Run(batch);
  }
  const HybridStepReport &plain = reports[0], &recomputed = reports[1];
  EXPECT_NEAR(recomputed.stats.reward_grad_norm, plain.stats.reward_grad_norm,
              1e-6 * plain.stats.reward_grad_norm);
  EXPECT_NEAR(recomputed.stats.distill_grad_norm, plain.stats.distill_grad_norm,
              1e-6 * plain.stats.distill_grad_norm);
  ASSERT_TRUE(plain.kdr_exact && recomputed.kdr_exact);
  EXPECT_NEAR(recomputed.kdr_exact->mean, plain.kdr_exact->mean,
              1e-6 * std::max(1.0, std::abs(plain.kdr_exact->mean)));
}

// A micro-batch with no trainable position (every response truncated under
// trainer.truncated: mask): the head computes over zero positions.
TEST(VocabHead, NoResponsePositionGivesZeroTermsForEveryLoss) {
  for (const Case& c : Cases()) {
    TrainBatch batch = BatchFor(c, 13);
    batch.response_mask = torch::zeros_like(batch.response_mask);
    model::Decoder m = TinyModel(2);
    LossConfig config;
    config.distill = c.loss;
    config.vocab_chunk_positions = 4;
    const TokenTerms tokens = ComputeTokenTerms(m, batch, config);
    const LossTerms terms = AggregateTerms(tokens, batch, config);
    EXPECT_EQ(terms.reward_loss.item<double>(), 0.0) << c.name;
    EXPECT_EQ(terms.distill_loss.item<double>(), 0.0) << c.name;
    EXPECT_EQ(tokens.distill.sizes(), batch.response_mask.sizes()) << c.name;
  }
}

TEST(VocabHead, RefusesTeacherRowsTheLossCannotRead) {
  model::Decoder m = TinyModel(1);
  LossConfig config;
  config.vocab_chunk_positions = 4;
  config.distill = DistillLoss::kReverseKl;
  const TrainBatch topk = BatchFor({"", DistillLoss::kTopkReverseKl, "topk"}, 2);
  EXPECT_THROW(ComputeTokenTerms(m, topk, config), std::invalid_argument);
  config.distill = DistillLoss::kTopkTailReverseKl;
  const TrainBatch full = BatchFor({"", DistillLoss::kReverseKl, "full"}, 2);
  EXPECT_THROW(ComputeTokenTerms(m, full, config), std::invalid_argument);
}

// The REQUIRES of VocabHeadChunkLogitGradient: each missing or misshapen
// argument is refused by name.
TEST(VocabHead, ChunkLogitGradientRefusesArgumentsItRequires) {
  const int64_t rows = 3, vocab = 5, k = 2;
  const torch::Tensor s = torch::randn({rows, vocab});
  const torch::Tensor targets = torch::randint(vocab, {rows}, torch::kInt64);
  const torch::Tensor ids = torch::randint(vocab, {rows, k}, torch::kInt64);
  const torch::Tensor teacher = torch::log_softmax(torch::randn({rows, vocab}), -1);
  auto message = [&](const VocabHeadOutputGrads& g, const torch::Tensor& y,
                     const torch::Tensor& topk, const torch::Tensor& q) -> std::string {
    try {
      VocabHeadChunkLogitGradient(s, g, y, topk, q, /*reverse_kl=*/true);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  VocabHeadOutputGrads with_set;
  with_set.set = torch::randn({rows, k});
  VocabHeadOutputGrads with_kl;
  with_kl.kl = torch::randn({rows});
  EXPECT_NE(message({}, targets.to(torch::kInt32), {}, {}).find("targets [n] int64"),
            std::string::npos);
  EXPECT_NE(message({}, targets.narrow(0, 0, 2), {}, {}).find("targets [n] int64"),
            std::string::npos);
  EXPECT_NE(message(with_set, targets, {}, {}).find("topk_ids [n, k] int64"), std::string::npos);
  EXPECT_NE(message(with_kl, targets, {}, teacher.narrow(1, 0, 4)).find("full_teacher [n, V]"),
            std::string::npos);
  // What each gradient needs, given: no complaint.
  EXPECT_EQ(message(with_set, targets, ids, {}), "");
  EXPECT_EQ(message(with_kl, targets, {}, teacher), "");
}

// The REQUIRES of VocabHeadLogitKernel: teacher rows, and one reward
// coefficient per position.
TEST(VocabHead, LogitKernelRefusesMissingTeacherRowsAndMisshapenCoefficients) {
  const int64_t rows = 3, vocab = 5, width = 4;
  VocabHeadInputs in;
  in.hidden = torch::randn({rows, width});
  in.weight = torch::randn({vocab, width});
  in.targets = torch::randint(vocab, {rows}, torch::kInt64);
  in.chunk_positions = 2;
  const torch::Tensor coefficient = torch::randn({rows});
  try {
    VocabHeadLogitKernel(in, coefficient);
    ADD_FAILURE() << "no teacher rows, no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("requires teacher rows"), std::string::npos) << e.what();
  }
  in.teacher.logprobs = torch::log_softmax(torch::randn({rows, vocab}), -1);
  EXPECT_EQ(VocabHeadLogitKernel(in, coefficient).sizes(), torch::IntArrayRef({rows}));
  EXPECT_THROW(VocabHeadLogitKernel(in, coefficient.narrow(0, 0, 2)), std::invalid_argument);
}

// ---- topk_tail_reverse_kl from its definition ----

// p, q over V ids at one position, the set S: the (k+1)-bucket KL written
// out term by term in float64.
double BucketKlReference(const torch::Tensor& p, const torch::Tensor& q,
                         const std::vector<int64_t>& set) {
  double kl = 0, p_set = 0, q_set = 0;
  for (int64_t v : set) {
    const double pv = p[v].item<double>(), qv = q[v].item<double>();
    kl += pv * (std::log(pv) - std::log(qv));
    p_set += pv;
    q_set += qv;
  }
  const double p_tail = 1 - p_set, q_tail = 1 - q_set;
  return kl + p_tail * (std::log(p_tail) - std::log(q_tail));
}

TEST(TopkTailReverseKl, EqualsTheBucketKlWrittenOut) {
  torch::manual_seed(2);
  const int64_t rows = 6, vocab = 40, k = 7;
  const torch::Tensor logp = torch::log_softmax(torch::randn({rows, vocab}, torch::kFloat64), -1);
  const torch::Tensor logq =
      torch::log_softmax(2 * torch::randn({rows, vocab}, torch::kFloat64), -1);
  const torch::Tensor ids = std::get<1>(logq.topk(k, -1));
  const torch::Tensor kl = TopkTailReverseKl(logp.gather(-1, ids), logq.gather(-1, ids));
  for (int64_t r = 0; r < rows; ++r) {
    const torch::Tensor row_ids = ids[r].contiguous();
    std::vector<int64_t> set(row_ids.data_ptr<int64_t>(), row_ids.data_ptr<int64_t>() + k);
    EXPECT_NEAR(kl[r].item<double>(), BucketKlReference(logp[r].exp(), logq[r].exp(), set), 1e-12)
        << "row " << r;
  }
  // k = V: no tail, the full reverse KL.
  const torch::Tensor all = torch::arange(vocab, torch::kInt64).expand({rows, vocab});
  const torch::Tensor full = TopkTailReverseKl(logp.gather(-1, all), logq.gather(-1, all));
  ExpectClose(full, ReverseKlFromLogProbs(logp, logq), 1e-9, "k = V");
}

TEST(TopkTailReverseKl, ClosedFormLogitGradientEqualsAutograd) {
  for (const double temperature : {1.0, 0.6}) {
    torch::manual_seed(4);
    const int64_t rows = 5, vocab = 30, k = 6;
    const torch::Tensor z = (3 * torch::randn({rows, vocab}, torch::kFloat64)).requires_grad_();
    const torch::Tensor logq =
        torch::log_softmax(2 * torch::randn({rows, vocab}, torch::kFloat64), -1);
    const torch::Tensor ids = std::get<1>(logq.topk(k, -1));
    // The teacher's sent tail, a nat off the rebuilt one: the closed form
    // must read the one autograd differentiates.
    const torch::Tensor sent_tail = TailLogMass(logq.gather(-1, ids)) - 1.0;
    const TeacherRows teacher{logq.gather(-1, ids), ids, sent_tail};
    const torch::Tensor targets = torch::randint(vocab, {rows}, torch::kInt64);
    for (const DistillLoss loss : {DistillLoss::kTopkTailReverseKl, DistillLoss::kTopkReverseKl}) {
      const torch::Tensor logp = torch::log_softmax(z / temperature, -1);
      const torch::Tensor set = logp.gather(-1, ids);
      const torch::Tensor per_row = loss == DistillLoss::kTopkTailReverseKl
                                        ? TopkTailReverseKl(set, teacher.logprobs, sent_tail)
                                        : TopkReverseKl(set, teacher.logprobs);
      const torch::Tensor autograd = torch::autograd::grad({per_row.sum()}, {z})[0];
      const torch::Tensor closed =
          DistillLogitGradient(logp.detach(), teacher, targets, loss, temperature);
      ExpectClose(closed, autograd, 1e-10,
                  "τ=" + std::to_string(temperature) +
                      (loss == DistillLoss::kTopkTailReverseKl ? " tail" : " renormalised"));
    }
  }
}

TEST(TopkTailReverseKl, AnEmptyTeacherTailIsFiniteNotNan) {
  // bfloat16 teacher values whose k probabilities round to a sum above 1.
  const torch::Tensor logq = torch::tensor({{std::log(0.7), std::log(0.31)}}, torch::kFloat32);
  const torch::Tensor logp = torch::tensor({{std::log(0.5), std::log(0.3)}}, torch::kFloat32);
  const torch::Tensor kl = TopkTailReverseKl(logp, logq);
  EXPECT_TRUE(torch::isfinite(kl).all().item<bool>());
  EXPECT_GT(kl.item<float>(), 0.0f);  // the student's 0.2 tail against a floored one
}

// Issue 53 item 4: a sent tail below 1e-12 stays in log space (−46 nats for
// 1e-20), where the floor made it −27.6 and halved the bucket's term.
TEST(TopkTailReverseKl, ASentTailBelowTheFloorIsKeptInLogSpace) {
  const torch::Tensor logq = torch::tensor({{std::log(0.6), std::log(0.4)}}, torch::kFloat64);
  const torch::Tensor logp = torch::tensor({{std::log(0.5), std::log(0.3)}}, torch::kFloat64);
  const torch::Tensor sent = torch::tensor({std::log(1e-20)}, torch::kFloat64);
  const double expected = 0.5 * std::log(0.5 / 0.6) + 0.3 * std::log(0.3 / 0.4) +
                          0.2 * (std::log(0.2) - std::log(1e-20));
  EXPECT_NEAR(TopkTailReverseKl(logp, logq, sent).item<double>(), expected, 1e-9);
}

TEST(TeacherTailMass, MeanAndP95OverResponsePositions) {
  // Tails 0.5, 0.25, 0.0 (floored, 1.1 > 1), and one masked position.
  const torch::Tensor logprobs = torch::tensor({{{std::log(0.25), std::log(0.25)},
                                                 {std::log(0.5), std::log(0.25)},
                                                 {std::log(0.6), std::log(0.5)},
                                                 {std::log(0.01), std::log(0.01)}}},
                                               torch::kFloat32);
  const torch::Tensor ids = torch::tensor({{{0, 1}, {0, 1}, {0, 1}, {0, 1}}}, torch::kInt64);
  const torch::Tensor mask = torch::tensor({{1.0f, 1.0f, 1.0f, 0.0f}});
  const std::optional<TailMass> mass = TeacherTailMass({logprobs, ids}, mask);
  ASSERT_TRUE(mass.has_value());
  EXPECT_NEAR(mass->mean, 0.25, 1e-6);
  EXPECT_NEAR(mass->p95, 0.475, 1e-6);  // linear interpolation between 0.25 and 0.5
  EXPECT_FALSE(TeacherTailMass({logprobs.select(2, 0), {}}, mask).has_value());
  // A tail the teacher sent is read as it is, not rebuilt from the values.
  const torch::Tensor sent = torch::tensor({{std::log(1e-5), std::log(0.1), 0.0, 0.0}});
  const std::optional<TailMass> read = TeacherTailMass({logprobs, ids, sent}, mask);
  ASSERT_TRUE(read.has_value());
  EXPECT_NEAR(read->mean, (1e-5 + 0.1 + 1.0) / 3, 1e-6);
}

// Compact top-k rows against the dense form the group decoder used to make
// (each row densified, -inf outside the k ids): topk_reverse_kl is the same.
TEST(CompactTopkRows, TopkReverseKlEqualsTheDensifiedRowForm) {
  std::vector<ScoredGroup> full = RandomGroups(2, 2, true, 8);
  const TrainBatch compact = BuildTrainBatch(ToTopk(full, 4), true, 0);
  model::Decoder m = TinyModel(2);
  LossConfig config;
  config.distill = DistillLoss::kTopkReverseKl;
  const TokenTerms terms = ComputeTokenTerms(m, compact, config);
  // Reference: renormalise p and q on the k ids of each dense row.
  const torch::Tensor dense =
      torch::full({compact.teacher_logprobs.size(0), compact.teacher_logprobs.size(1), kVocab},
                  -std::numeric_limits<float>::infinity())
          .scatter_(2, compact.teacher_topk_ids, compact.teacher_logprobs);
  const torch::Tensor on_set = torch::isfinite(dense);
  const torch::Tensor logp = terms.logprobs.detach();
  const torch::Tensor p_set = torch::log_softmax(logp.masked_fill(~on_set, -INFINITY), -1);
  const torch::Tensor q_set = torch::log_softmax(dense, -1);
  const torch::Tensor reference = (p_set.exp() * (p_set - q_set).masked_fill(~on_set, 0)).sum(-1);
  const torch::Tensor at = compact.response_mask > 0;
  ExpectClose(terms.distill.detach().masked_select(at), reference.masked_select(at), 1e-5,
              "compact vs dense");
  EXPECT_EQ(compact.teacher_bytes(), compact.teacher_logprobs.numel() * 4 +
                                         compact.teacher_topk_ids.numel() * 8 +
                                         compact.teacher_tail_logmass.numel() * 4);
}

// ---- teacher rows as hidden states (teacher.rows: hidden) ----

constexpr int64_t kTeacherWidth = 6;

// The teacher's head [16, D_t] and, per sample, hidden rows [T, D_t] scaled
// so the distributions are as peaked as a trained teacher's; the same groups
// with the full rows log_softmax(h Wᵀ) written from the definition in
// float64 (what a teacher sending all V log-probs sends).
struct HiddenAndFull {
  TeacherHead head;
  std::vector<ScoredGroup> hidden, full;
};

HiddenAndFull HiddenTeacherGroups(uint64_t seed) {
  HiddenAndFull out;
  out.hidden = RandomGroups(3, 2, /*with_teacher=*/false, seed);
  out.head.weight = torch::randn({kVocab, kTeacherWidth});
  out.full = out.hidden;
  for (size_t g = 0; g < out.hidden.size(); ++g) {
    for (size_t i = 0; i < out.hidden[g].samples.size(); ++i) {
      const int64_t length = static_cast<int64_t>(out.hidden[g].samples[i].response_tokens.size());
      const torch::Tensor h = 2.0 * torch::randn({length, kTeacherWidth});
      out.hidden[g].samples[i].teacher_hidden = h;
      out.full[g].samples[i].teacher_logprobs =
          torch::log_softmax(
              torch::matmul(h.to(torch::kFloat64), out.head.weight.to(torch::kFloat64).t()), -1)
              .to(torch::kFloat32);
    }
  }
  return out;
}

struct HiddenAndFullBatches {
  TrainBatch hidden, full;
};

HiddenAndFullBatches HiddenTeacherBatches(uint64_t seed) {
  const HiddenAndFull groups = HiddenTeacherGroups(seed);
  HiddenAndFullBatches out{BuildTrainBatch(groups.hidden, true, 0),
                           BuildTrainBatch(groups.full, true, 0)};
  out.hidden.teacher_head = groups.head;
  return out;
}

const std::vector<Case>& HiddenCases() {
  static const std::vector<Case> cases = {
      {"reverse_kl", DistillLoss::kReverseKl, "hidden"},
      {"forward_kl", DistillLoss::kForwardKl, "hidden"},
      {"sampled_reverse_kl", DistillLoss::kSampledReverseKl, "hidden"},
  };
  return cases;
}

// The hidden form is the full form: every term and both parameter
// gradients, at each chunk size, temperature and with padded rows.
TEST(HiddenTeacherRows, GiveTheFullRowsTermsAndGradients) {
  const HiddenAndFullBatches batches = HiddenTeacherBatches(31);
  EXPECT_FALSE(batches.hidden.teacher_logprobs.defined());
  for (const Case& c : HiddenCases()) {
    for (const double temperature : {1.0, 0.7}) {
      for (const int64_t vocab_limit : {int64_t{0}, kVocab}) {
        model::Decoder m = vocab_limit == 0 ? TinyModel(3) : PaddedTinyModel(3);
        LossConfig config;
        config.distill = c.loss;
        config.temperature = temperature;
        config.vocab_limit = vocab_limit;
        for (const int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{1000}}) {
          config.vocab_chunk_positions = chunk;
          const std::string what = c.name + " τ=" + std::to_string(temperature) +
                                   " limit=" + std::to_string(vocab_limit) +
                                   " chunk=" + std::to_string(chunk);
          ExpectSame(Measure(m, batches.hidden, config), Measure(m, batches.full, config), what);
        }
      }
    }
  }
}

// The whole step reads the one distribution: cheap K_DR (logit and last
// layer), m3_mask, the exact K_DR and κ's two gradient norms.
TEST(HiddenTeacherRows, TheStepsKdrMaskAndKappaEqualTheFullRows) {
  const HiddenAndFullBatches batches = HiddenTeacherBatches(37);
  for (const Case& c : HiddenCases()) {
    HybridStepReport reports[2];
    for (int hidden = 0; hidden < 2; ++hidden) {
      model::Decoder m = TinyModel(9);
      HybridStepConfig config;
      config.loss.distill = c.loss;
      config.loss.vocab_chunk_positions = 4;
      config.micro_batch_sequences = 4;
      config.monitor.kdr_estimator = KdrEstimator::kLogit;
      config.monitor.kdr_exact_every = 1;
      config.monitor.kdr_exact_positions = 4;
      config.balance.mask = true;
      config.balance.mask_estimator = KdrEstimator::kLogit;
      auto optimizer = std::make_unique<PolicyOptimizer>(m, 1e-6, 0.0, /*max_grad_norm=*/0.0);
      HybridStep step(m, std::move(optimizer), config);
      reports[hidden] = step.Run(hidden ? batches.hidden : batches.full);
    }
    const HybridStepReport &full = reports[0], &hidden = reports[1];
    ASSERT_TRUE(full.kdr && hidden.kdr) << c.name;
    ASSERT_EQ(hidden.kdr_values.size(), full.kdr_values.size()) << c.name;
    for (size_t i = 0; i < full.kdr_values.size(); ++i) {
      EXPECT_NEAR(hidden.kdr_values[i], full.kdr_values[i],
                  1e-5 * std::max(1.0f, std::abs(full.kdr_values[i])))
          << c.name << " position " << i;
    }
    EXPECT_EQ(hidden.masked_positions, full.masked_positions) << c.name;
    EXPECT_GT(full.masked_positions, 0) << c.name << ": the mask should have acted";
    ASSERT_TRUE(full.kdr_exact && hidden.kdr_exact) << c.name;
    EXPECT_NEAR(hidden.kdr_exact->mean, full.kdr_exact->mean,
                1e-5 * std::max(1.0, std::abs(full.kdr_exact->mean)))
        << c.name;
    EXPECT_NEAR(hidden.stats.reward_grad_norm, full.stats.reward_grad_norm,
                1e-5 * full.stats.reward_grad_norm)
        << c.name;
    EXPECT_NEAR(hidden.stats.distill_grad_norm, full.stats.distill_grad_norm,
                1e-5 * full.stats.distill_grad_norm)
        << c.name;
    EXPECT_EQ(hidden.teacher_bytes, batches.hidden.teacher_hidden.numel() * 4) << c.name;
  }
}

// RSTG's teacher confidence (max_v q and q(y)) from hidden rows.
TEST(HiddenTeacherRows, RstgConfidenceEqualsTheFullRows) {
  const HiddenAndFullBatches batches = HiddenTeacherBatches(41);
  const TrainBatch& full = batches.full;
  torch::Tensor rewards = torch::zeros_like(full.rewards);
  for (const auto confidence :
       {RstgConfig::Confidence::kMaxProb, RstgConfig::Confidence::kTokenProb}) {
    RstgConfig config;
    config.confidence = confidence;
    const torch::Tensor entropy = torch::rand(full.response_mask.sizes());
    const DistillSelection a = RstgSelect(rewards, full.response_mask, full.teacher(),
                                          full.target_tokens, entropy, entropy, config);
    const DistillSelection b =
        RstgSelect(rewards, batches.hidden.response_mask, batches.hidden.teacher(),
                   batches.hidden.target_tokens, entropy, entropy, config);
    ExpectClose(b.weights, a.weights, 1e-5, "RSTG weights");
  }
}

TEST(HiddenTeacherRows, AreRefusedWhereTheyCannotBeRead) {
  const HiddenAndFullBatches batches = HiddenTeacherBatches(43);
  model::Decoder m = TinyModel(1);
  LossConfig config;
  auto message = [&](const TrainBatch& batch) -> std::string {
    try {
      ComputeTokenTerms(m, batch, config);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  // The one-[B, L, V] path never sees them (it would distil from nothing).
  EXPECT_NE(message(batches.hidden).find("trainer.vocab_chunk_positions"), std::string::npos);
  config.vocab_chunk_positions = 4;
  EXPECT_EQ(message(batches.hidden), "");
  config.distill = DistillLoss::kTopkTailReverseKl;
  EXPECT_NE(message(batches.hidden).find("not a top-k loss"), std::string::npos);
  config.distill = DistillLoss::kReverseKl;
  TrainBatch wrong_width = batches.hidden;
  wrong_width.teacher_head.weight = torch::randn({kVocab, kTeacherWidth + 1});
  EXPECT_NE(message(wrong_width).find("want [N, D_t] and [V, D_t]"), std::string::npos);
  TrainBatch no_head = batches.hidden;
  no_head.teacher_head = {};
  EXPECT_NE(message(no_head).find("need the teacher's head"), std::string::npos);
}

TEST(HiddenTeacherRows, BuildTrainBatchRefusesBadHiddenRows) {
  HiddenAndFull groups = HiddenTeacherGroups(47);
  std::vector<ScoredGroup> nan = groups.hidden;
  nan[1].samples[0].teacher_hidden[0][2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<ScoredGroup> width = groups.hidden;
  width[2].samples[1].teacher_hidden = torch::randn(
      {static_cast<int64_t>(width[2].samples[1].response_tokens.size()), kTeacherWidth + 2});
  std::vector<ScoredGroup> mixed = groups.hidden;
  mixed[0].samples[1] = groups.full[0].samples[1];
  for (const auto& [bad, says] :
       {std::pair{nan, "non-finite teacher_hidden"}, std::pair{width, "teacher_hidden"},
        std::pair{mixed, "in one form"}}) {
    try {
      BuildTrainBatch(bad, true, 0);
      ADD_FAILURE() << says << ": no exception";
    } catch (const BadGroupError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

// Issue 53 item 4: the cheap K_DR (and so m3_mask) reads the loss's own
// logits. Under bf16 autocast the loss's product h Wᵀ runs in bfloat16; the
// kernel recomputed outside autocast took float32 logits and judged another
// gradient than the one the step applies.
TEST(VocabHead, UnderBf16TheLogitKernelReadsTheLossesOwnLogits) {
  model::Decoder m = TinyModel(3);
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = m->forward(torch::arange(3, 16).unsqueeze(0));
    m->OutputWeight().mul_(20.0 / logits.abs().max().item<double>());
  }
  const TrainBatch batch = BatchFor({"", DistillLoss::kReverseKl, "full"}, 11);
  LossConfig config;
  config.vocab_chunk_positions = 4;
  TokenTerms tokens;
  {
    const AutocastGuard autocast(torch::kCPU, Precision::kBFloat16);
    tokens = ComputeTokenTerms(m, batch, config);
  }
  const VocabHeadInputs in = HeadInputs(tokens, batch, config);
  const torch::Tensor coefficient = torch::randn({in.hidden.size(0)});
  const torch::Tensor kernel = VocabHeadLogitKernel(in, coefficient);
  // Reference: the closed forms on the bfloat16 product, written here.
  const torch::Tensor s =
      torch::matmul(in.hidden.to(torch::kBFloat16), in.weight.to(torch::kBFloat16).t())
          .to(torch::kFloat32);
  const torch::Tensor lp = torch::log_softmax(s, -1);
  const torch::Tensor p = lp.exp();
  const torch::Tensor q = in.teacher.logprobs;
  const torch::Tensor onehot = torch::zeros_like(p).scatter_(-1, in.targets.unsqueeze(-1), 1.0);
  const torch::Tensor g_r = coefficient.unsqueeze(-1) * (onehot - p);
  const torch::Tensor kl = (p * (lp - q)).sum(-1, true);
  const torch::Tensor g_d = p * (lp - q - kl);
  const torch::Tensor reference = (g_r * g_d).sum(-1);
  // The closed forms on float32 logits, the kernel as it was: visibly
  // another value, so the first check can tell the two apart.
  const torch::Tensor lp32 = torch::log_softmax(torch::matmul(in.hidden, in.weight.t()), -1);
  const torch::Tensor p32 = lp32.exp();
  const torch::Tensor kl32 = (p32 * (lp32 - q)).sum(-1, true);
  const torch::Tensor fp32_kernel =
      ((coefficient.unsqueeze(-1) * (onehot - p32)) * (p32 * (lp32 - q - kl32))).sum(-1);
  const double scale = reference.abs().max().item<double>();
  ASSERT_GT(scale, 0.0);
  const double error = (kernel - reference).abs().max().item<double>() / scale;
  const double fp32_gap = (fp32_kernel - reference).abs().max().item<double>() / scale;
  EXPECT_LT(error, 1e-5) << "the kernel is not the bf16 loss's (fp32 logits differ by " << fp32_gap
                         << ")";
  EXPECT_GT(fp32_gap, 1e-3) << "float32 logits should differ visibly at logits ~20";
  EXPECT_TRUE(torch::equal(kernel.sign(), reference.sign()));
}

}  // namespace
}  // namespace kappa::learner
