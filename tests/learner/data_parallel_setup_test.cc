// Which rank a learner process is, from config and flags; and the prompt
// shards that keep ranks from sampling the same prompts.
#include "learner/data_parallel_setup.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "learner/prompt_source.h"

namespace kappa::learner {
namespace {

std::string Error(const absl::StatusOr<DataParallelSetup>& setup) {
  return setup.ok() ? "" : std::string(setup.status().message());
}

TEST(DataParallelSetupTest, SingleProcessByDefault) {
  services::Config config;
  absl::StatusOr<DataParallelSetup> setup = ResolveDataParallel(config, {}, "host");
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_EQ(setup->world_size, 1);
  EXPECT_TRUE(setup->primary());
  EXPECT_EQ(setup->local_groups_per_step, config.trainer.groups_per_step);
}

TEST(DataParallelSetupTest, FlagsOverTheConfigAndAutoRankFromTheHostName) {
  services::Config config;
  config.trainer.groups_per_step = 8;
  config.learner.world_size = 2;
  config.learner.dist_store = "tcp://learner-0.learner:29500";
  absl::StatusOr<DataParallelSetup> setup =
      ResolveDataParallel(config, {{"rank", "auto"}, {"world-size", "4"}}, "learner-3");
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_EQ(setup->rank, 3);
  EXPECT_EQ(setup->world_size, 4);
  EXPECT_EQ(setup->store, "tcp://learner-0.learner:29500");
  EXPECT_EQ(setup->local_groups_per_step, 2);
  EXPECT_FALSE(setup->primary());
}

TEST(DataParallelSetupTest, BadSettingsNameTheFlagOrKey) {
  services::Config config;
  config.trainer.groups_per_step = 6;
  EXPECT_EQ(Error(ResolveDataParallel(config, {{"world-size", "0"}}, "h")),
            "--world-size / learner.world_size: want an integer >= 1, got '0'");
  EXPECT_EQ(Error(ResolveDataParallel(config, {{"world-size", "2"}, {"rank", "2"}}, "h")),
            "--rank: 2 is outside [0, 2) (the world size)");
  EXPECT_EQ(Error(ResolveDataParallel(config, {{"world-size", "2"}, {"rank", "auto"}}, "box")),
            "--rank auto: host name 'box' does not end in -N (a StatefulSet ordinal)");
  EXPECT_NE(Error(ResolveDataParallel(config, {{"world-size", "2"}}, "h")).find("--dist-store"),
            std::string::npos);
  EXPECT_EQ(Error(ResolveDataParallel(
                config, {{"world-size", "4"}, {"dist-store", "tcp://h:1"}}, "h")),
            "trainer.groups_per_step (6) must be a multiple of the world size (4)");
  // A sharded optimizer with nobody to share it with.
  config.learner.shard = services::LearnerShard::kOptimizer;
  EXPECT_EQ(Error(CheckWorldSize(config, 1)),
            "learner.shard: optimizer splits state over the data-parallel ranks, and "
            "learner.world_size is 1 (set it above 1, or learner.shard: none)");
  EXPECT_TRUE(CheckWorldSize(config, 2).ok());
}

TEST(PromptShardsTest, RanksSplitEachEpochBetweenThem) {
  constexpr size_t kSize = 12;
  PromptSource whole(kSize, 7);
  std::vector<size_t> sequence;
  for (size_t i = 0; i < 2 * kSize; ++i) sequence.push_back(whole.Next());
  for (int shard = 0; shard < 3; ++shard) {
    PromptSource part(kSize, 7, 0, shard, 3);
    std::set<size_t> epoch;
    for (size_t i = 0; i < 2 * kSize / 3; ++i) {
      const size_t index = part.Next();
      // Every 3rd prompt of the one sequence, starting at the shard.
      EXPECT_EQ(index, sequence[i * 3 + static_cast<size_t>(shard)]) << "shard " << shard;
      if (i < kSize / 3) epoch.insert(index);
    }
    EXPECT_EQ(epoch.size(), kSize / 3);  // no repeats within an epoch
  }
  EXPECT_THROW(PromptSource(kSize, 7, 0, 3, 3), std::invalid_argument);
}

TEST(DataParallelSetupTest, EachRankTakesItsOwnGpuUnderPlainCuda) {
  DataParallelSetup setup;
  setup.world_size = 4;
  for (int rank = 0; rank < 4; ++rank) {
    setup.rank = rank;
    EXPECT_EQ(RankCudaIndex("cuda", 0, setup, 4), rank);  // four ranks on a 4-GPU machine
    EXPECT_EQ(RankCudaIndex("cuda", 0, setup, 2), rank % 2);
    EXPECT_EQ(RankCudaIndex("cuda", 0, setup, 1), 0);      // a pod that sees one GPU
    EXPECT_EQ(RankCudaIndex("cuda:3", 3, setup, 4), 3);    // pinned as asked
  }
  setup.world_size = 1;
  setup.rank = 0;
  EXPECT_EQ(RankCudaIndex("cuda", 0, setup, 8), 0);
}

}  // namespace
}  // namespace kappa::learner
