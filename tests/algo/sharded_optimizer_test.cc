// learner.shard: optimizer and gradients (ZeRO stages 1 and 2,
// learner/algo/sharded_adamw.h, optimizer_step.h) on real c10d Gloo groups,
// R ranks in threads: over 20 steps, with κ measured and not, full and LoRA
// training, the sharded ranks' parameters equal the unsharded ranks' on the
// same shares (and stay bitwise equal across ranks), κ, the cosine and the
// clip factor equal to 1e-6, each rank holds only its share of the moments;
// ranks with different numbers of micro-batches still reduce in step; and a
// sharded run's checkpoints resume it exactly, an unsharded run's state
// resumes sharded, and a shard of another layout is refused by name.
//
// KAPPA_SHARDED_PARITY_WIDE=1 runs the same tests on issue 54's second
// shape: the Qwen2.5-0.5B width (d 896, f 4,864, 14 heads, 2 KV heads),
// 2 layers, the real 151,936-token vocabulary (minutes, not a CI test:
// bench/README.md "Sharding the gradients").
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/collectives.h"
#include "learner/algo/hybrid_step.h"
#include "learner/algo/sharded_adamw.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::RandomGroups;
using testing::TinyModel;

constexpr int kGroupsPerStep = 4;

bool Wide() {
  const char* wide = std::getenv("KAPPA_SHARDED_PARITY_WIDE");
  return wide != nullptr && std::string(wide) == "1";
}

model::Decoder WideModel(uint64_t seed) {
  model::ModelConfig c;
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = true;
  torch::manual_seed(seed);
  return model::Decoder(c);
}
constexpr double kLearningRate = 1e-3;

struct RunSetup {
  int ranks = 1;
  bool shard = false;
  ShardStage stage = ShardStage::kOptimizer;
  // Groups of each step per rank; empty: kGroupsPerStep / ranks each.
  std::vector<int> groups_per_rank;
  int64_t micro_batch_sequences = 0;  // HybridStepConfig's: 0 one micro-batch
  bool lora = false;
  int64_t kappa_every = 1;
  int steps = 20;
  int first_step = 0;    // of the data: a resumed run goes on where it stopped
  std::string save_dir;  // non-empty: each rank saves its optimizer state here
  std::string load_dir;  // non-empty: each rank loads from here first
  // The saving run's ranks when not `ranks`: each rank loads every one of
  // their files (PolicyOptimizer::LoadResharded).
  int load_ranks = 0;
};

struct RankResult {
  std::vector<torch::Tensor> parameters;
  std::vector<double> kappas, cosines, grad_norms;
  int64_t moment_elements = 0;  // the AdamW moments this rank holds
  std::string load_error;
};

model::Decoder Model(bool lora) {
  model::Decoder m = Wide() ? WideModel(21) : TinyModel(21);
  if (!lora) return m;
  model::LoraConfig config;
  config.rank = 2;
  config.target_modules = {"q_proj", "v_proj", "down_proj"};
  torch::manual_seed(5);
  m->EnableLora(config);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) {
    const bool adapter = p.key().find(".lora_") != std::string::npos;
    if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0.0, 0.05);
    p.value().set_requires_grad(adapter);
  }
  return m;
}

std::string StatePath(const std::string& dir, int rank) {
  return dir + "/optimizer-rank" + std::to_string(rank) + ".pt";
}

RankResult TrainRank(const RunSetup& run, int rank, dist::Collectives* collectives,
                     const std::vector<std::vector<ScoredGroup>>& data, model::Decoder model) {
  HybridStepConfig config;
  config.loss.lambda = 0.5;
  config.monitor.kappa_every = run.kappa_every;
  config.micro_batch_sequences = run.micro_batch_sequences;
  auto optimizer =
      std::make_unique<PolicyOptimizer>(model, kLearningRate, 0.01, /*max_grad_norm=*/0.5);
  if (run.shard) optimizer->ShardState(run.stage, rank, run.ranks);
  RankResult result;
  if (!run.load_dir.empty()) {
    try {
      if (run.load_ranks > 0 && run.load_ranks != run.ranks) {
        std::vector<std::string> paths;
        for (int r = 0; r < run.load_ranks; ++r) paths.push_back(StatePath(run.load_dir, r));
        optimizer->LoadResharded(paths);
      } else {
        optimizer->Load(StatePath(run.load_dir, rank));
      }
    } catch (const std::runtime_error& e) {
      result.load_error = e.what();
      return result;
    }
  }
  optimizer->set_collectives(collectives);
  PolicyOptimizer* raw = optimizer.get();
  HybridStep step(model, std::move(optimizer), config);
  std::vector<int> groups(run.groups_per_rank);
  if (groups.empty()) groups.assign(run.ranks, kGroupsPerStep / run.ranks);
  int first_group = 0;
  for (int r = 0; r < rank; ++r) first_group += groups[r];
  for (int s = run.first_step; s < run.first_step + run.steps; ++s) {
    const std::vector<ScoredGroup> share(data[s].begin() + first_group,
                                         data[s].begin() + first_group + groups[rank]);
    const HybridStepReport report = step.Run(BuildTrainBatch(share, true, 0));
    result.kappas.push_back(report.stats.kappa().value_or(-1));
    result.cosines.push_back(report.stats.grad_cosine);
    result.grad_norms.push_back(report.stats.grad_norm);  // the clip factor is 0.5 / this
  }
  if (!run.save_dir.empty()) raw->Save(StatePath(run.save_dir, rank));
  for (const auto& state : raw->optimizer().state()) {
    const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*state.second);
    result.moment_elements += adam.exp_avg().numel();
  }
  for (const torch::Tensor& p : model->parameters())
    result.parameters.push_back(p.detach().clone());
  return result;
}

// Every rank of `run` on its share of each step's groups, one thread each.
std::vector<RankResult> Train(const RunSetup& run, std::vector<model::Decoder> models = {}) {
  std::vector<std::vector<ScoredGroup>> data;
  for (int s = 0; s < run.first_step + run.steps; ++s) {
    data.push_back(RandomGroups(kGroupsPerStep, 3, true, 300 + s, Wide() ? 151936 : 16));
  }
  // Models come from torch's global generator: made before the threads.
  for (int r = static_cast<int>(models.size()); r < run.ranks; ++r)
    models.push_back(Model(run.lora));
  dist::InProcessRendezvous rendezvous(run.ranks);
  std::vector<RankResult> results(run.ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < run.ranks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<dist::Collectives> collectives = rendezvous.Join(r);
      results[r] = TrainRank(run, r, collectives.get(), data, models[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// ‖a − b‖ / ‖b‖. Not elementwise: the sharded gradients are summed in
// another order than the unsharded all-reduce, and an element whose
// gradient is rounding noise (its ranks' parts cancel) takes an AdamW step
// of ±lr whose sign is that noise's, whatever the order.
double RelativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-12)).item<double>();
}

// The sharded run against the unsharded one on the same shares. Stage 1
// sums the gradients exactly as unsharded (the same all-reduce): its κ,
// cosine and clip factor agree to 1e-6 at every step. Stage 2 sums them by
// reduce-scatter, in another order: 1e-6 at the first step (the same
// weights, only the order of the float32 sums differs), 1e-5 after (the
// trajectories drift apart by those roundings; 2e-6 was the most seen).
void ExpectSameRun(const std::vector<RankResult>& sharded, const RankResult& unsharded,
                   ShardStage stage = ShardStage::kOptimizer) {
  ASSERT_EQ(sharded[0].parameters.size(), unsharded.parameters.size());
  for (size_t r = 0; r < sharded.size(); ++r) {
    for (size_t i = 0; i < unsharded.parameters.size(); ++i) {
      EXPECT_TRUE(torch::equal(sharded[r].parameters[i], sharded[0].parameters[i]))
          << "rank " << r << " parameter " << i << " differs from rank 0's";
      EXPECT_LE(RelativeDifference(sharded[r].parameters[i], unsharded.parameters[i]), 1e-5)
          << "rank " << r << " parameter " << i << ": max |diff| "
          << (sharded[r].parameters[i] - unsharded.parameters[i]).abs().max().item<double>();
    }
  }
  for (size_t s = 0; s < unsharded.kappas.size(); ++s) {
    const double tolerance = stage == ShardStage::kOptimizer || s == 0 ? 1e-6 : 1e-5;
    EXPECT_NEAR(sharded[0].kappas[s], unsharded.kappas[s],
                tolerance * std::fabs(unsharded.kappas[s]))
        << "step " << s;
    EXPECT_NEAR(sharded[0].cosines[s], unsharded.cosines[s], tolerance) << "step " << s;
    EXPECT_NEAR(sharded[0].grad_norms[s], unsharded.grad_norms[s],
                tolerance * unsharded.grad_norms[s])
        << "step " << s;
  }
}

TEST(ShardedOptimizerTest, ShardsCoverTheVectorInEqualPaddedSegments) {
  EXPECT_EQ(PaddedLength(10, 4), 12);
  const ShardRange last = ShardOf(10, 3, 4);
  EXPECT_EQ(last.begin, 9);
  EXPECT_EQ(last.end, 10);
  int64_t covered = 0;
  for (int r = 0; r < 4; ++r) covered += ShardOf(10, r, 4).size();
  EXPECT_EQ(covered, 10);
  EXPECT_EQ(ShardOf(2, 3, 4).size(), 0);  // more ranks than elements: empty shards
}

const char* StageName(ShardStage stage) {
  return stage == ShardStage::kGradients ? "gradients" : "optimizer";
}

TEST(ShardedOptimizerTest, EveryStageAndNumberOfRanksEqualsTheUnshardedRun) {
  // The wide shape skips one rank (sharding over one rank changes nothing)
  // for time.
  const std::vector<int> rank_counts = Wide() ? std::vector<int>{2, 4} : std::vector<int>{1, 2, 4};
  for (int ranks : rank_counts) {
    for (bool lora : {false, true}) {
      for (int64_t kappa_every : {1, 0}) {
        RunSetup run;
        run.ranks = ranks;
        run.lora = lora;
        run.kappa_every = kappa_every;
        const std::vector<RankResult> unsharded = Train(run);
        for (ShardStage stage : {ShardStage::kOptimizer, ShardStage::kGradients}) {
          SCOPED_TRACE(std::string("learner.shard: ") + StageName(stage) + ", ranks " +
                       std::to_string(ranks) + (lora ? " lora" : " full") + " kappa_every " +
                       std::to_string(kappa_every));
          run.shard = true;
          run.stage = stage;
          const std::vector<RankResult> sharded = Train(run);
          ExpectSameRun(sharded, unsharded[0], stage);
          // Each rank holds its share of the moments, in its own tensors: the
          // unsharded ranks hold all of them, the sharded libtorch state none.
          EXPECT_GT(unsharded[0].moment_elements, 0);
          for (const RankResult& r : sharded) EXPECT_EQ(r.moment_elements, 0);
        }
      }
    }
  }
}

// Sharded gradients reduce after every micro-batch: a rank with fewer
// micro-batches (here 1 against 3) pads with empty reductions instead of
// leaving the others waiting, and the step is still the unsharded one.
TEST(ShardedOptimizerTest, RanksWithDifferentNumbersOfMicroBatchesReduceInStep) {
  for (int64_t kappa_every : {1, 0}) {
    SCOPED_TRACE("kappa_every " + std::to_string(kappa_every));
    RunSetup run;
    run.ranks = 2;
    run.groups_per_rank = {3, 1};
    run.micro_batch_sequences = 3;  // one group of 3 responses per micro-batch
    run.kappa_every = kappa_every;
    run.steps = 6;
    const std::vector<RankResult> unsharded = Train(run);
    run.shard = true;
    run.stage = ShardStage::kGradients;
    ExpectSameRun(Train(run), unsharded[0], ShardStage::kGradients);
  }
}

// `first` for half its steps, saving each rank's optimizer state in `dir`;
// then `second` (its other settings as given) resumes from them for the
// other half, on the weights a checkpoint would restore: the first half's.
std::vector<RankResult> SaveHalfwayAndResume(RunSetup first, RunSetup second,
                                             const std::string& dir) {
  const int half = first.steps / 2;
  first.steps = half;
  first.save_dir = dir;
  const std::vector<RankResult> halfway = Train(first);
  second.steps = half;
  second.first_step = half;
  second.load_dir = dir;
  std::vector<model::Decoder> models;
  for (int r = 0; r < second.ranks; ++r) {
    models.push_back(Model(second.lora));
    torch::NoGradGuard no_grad;
    auto params = models.back()->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(halfway[0].parameters[i]);
  }
  return Train(second, models);
}

// A resumed run loaded its state and ended within 1e-5 (‖Δ‖ / ‖p‖) of
// `reference`'s parameters.
void ExpectResumedNear(const std::vector<RankResult>& resumed, const RankResult& reference) {
  ASSERT_TRUE(resumed[0].load_error.empty()) << resumed[0].load_error;
  for (size_t i = 0; i < reference.parameters.size(); ++i) {
    EXPECT_LE(RelativeDifference(resumed[0].parameters[i], reference.parameters[i]), 1e-5)
        << "parameter " << i;
  }
}

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kappa_sharded_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_F(ShardedCheckpointTest, ASavedShardResumesTheRunExactly) {
  for (ShardStage stage : {ShardStage::kOptimizer, ShardStage::kGradients}) {
    SCOPED_TRACE(std::string("learner.shard: ") + StageName(stage));
    RunSetup straight;
    straight.ranks = 2;
    straight.shard = true;
    straight.stage = stage;
    straight.steps = 6;
    const std::vector<RankResult> whole = Train(straight);

    RunSetup second = straight;
    const std::vector<RankResult> resumed = SaveHalfwayAndResume(straight, second, dir_);
    ASSERT_TRUE(resumed[0].load_error.empty()) << resumed[0].load_error;
    for (size_t i = 0; i < whole[0].parameters.size(); ++i) {
      EXPECT_TRUE(torch::equal(resumed[0].parameters[i], whole[0].parameters[i]))
          << "parameter " << i << ": max |diff| "
          << (resumed[0].parameters[i] - whole[0].parameters[i]).abs().max().item<double>();
    }
  }
}

TEST_F(ShardedCheckpointTest, AnUnshardedRunsStateResumesSharded) {
  RunSetup straight;
  straight.ranks = 2;
  straight.steps = 6;
  const std::vector<RankResult> whole = Train(straight);  // unsharded throughout

  RunSetup second = straight;
  second.shard = true;
  const std::vector<RankResult> resumed = SaveHalfwayAndResume(straight, second, dir_);
  ExpectResumedNear(resumed, whole[0]);
}

// Resuming at another world size reshards the optimizer state: 2 sharded
// ranks → 1 unsharded, 1 → 4 sharded, 2 → 4 and 4 → 2 sharded each continue
// the run the one process makes straight through.
TEST_F(ShardedCheckpointTest, AnotherWorldSizeReshardsTheOptimizerState) {
  RunSetup single;
  single.steps = 10;
  const std::vector<RankResult> straight = Train(single);
  struct Change {
    int from, to;
    bool from_sharded, to_sharded;
    ShardStage stage;
  };
  for (const Change& change : {Change{2, 1, true, false, ShardStage::kOptimizer},
                               Change{1, 4, false, true, ShardStage::kOptimizer},
                               Change{2, 4, true, true, ShardStage::kGradients},
                               Change{4, 2, true, true, ShardStage::kOptimizer}}) {
    SCOPED_TRACE(std::to_string(change.from) + (change.from_sharded ? " sharded" : "") + " → " +
                 std::to_string(change.to) + (change.to_sharded ? " sharded" : ""));
    std::system(("rm -f " + dir_ + "/*").c_str());
    RunSetup first = single, second = single;
    first.ranks = change.from;
    first.shard = change.from_sharded;
    first.stage = change.stage;
    second.ranks = change.to;
    second.shard = change.to_sharded;
    second.stage = change.stage;
    second.load_ranks = change.from;
    const std::vector<RankResult> resumed = SaveHalfwayAndResume(first, second, dir_);
    ExpectResumedNear(resumed, straight[0]);
  }
}

TEST_F(ShardedCheckpointTest, AnIncompleteSetOfShardsIsRefusedByName) {
  RunSetup saved;
  saved.ranks = 2;
  saved.shard = true;
  saved.steps = 1;
  saved.save_dir = dir_;
  Train(saved);
  std::remove(StatePath(dir_, 1).c_str());
  std::system(("cp " + StatePath(dir_, 0) + " " + StatePath(dir_, 1)).c_str());

  RunSetup one;  // rank 0's shard twice: rank 1's is missing
  one.steps = 1;
  one.load_dir = dir_;
  one.load_ranks = 2;
  const std::vector<RankResult> refused = Train(one);
  EXPECT_NE(refused[0].load_error.find("not one set"), std::string::npos) << refused[0].load_error;
  EXPECT_NE(refused[0].load_error.find("rank 0 of 2"), std::string::npos) << refused[0].load_error;
}

TEST_F(ShardedCheckpointTest, AShardOfAnotherLayoutIsRefusedByName) {
  RunSetup saved;
  saved.ranks = 2;
  saved.shard = true;
  saved.steps = 1;
  saved.save_dir = dir_;
  Train(saved);

  RunSetup unsharded = saved;  // the shards, read by an unsharded learner
  unsharded.shard = false;
  unsharded.save_dir.clear();
  unsharded.load_dir = dir_;
  const std::vector<RankResult> refused = Train(unsharded);
  EXPECT_NE(refused[0].load_error.find("learner.shard"), std::string::npos)
      << refused[0].load_error;

  // Rank 0's shard of 2, read as rank 0 of 4 (the files of ranks 2 and 3
  // are rank 0's and 1's copied).
  for (int r = 2; r < 4; ++r) {
    std::system(("cp " + StatePath(dir_, r - 2) + " " + StatePath(dir_, r)).c_str());
  }
  RunSetup four = unsharded;
  four.ranks = 4;
  four.shard = true;
  const std::vector<RankResult> other_layout = Train(four);
  EXPECT_NE(other_layout[0].load_error.find("rank 0 of 2"), std::string::npos)
      << other_layout[0].load_error;
  EXPECT_NE(other_layout[0].load_error.find("learner.world_size"), std::string::npos)
      << other_layout[0].load_error;
}

}  // namespace
}  // namespace kappa::learner
