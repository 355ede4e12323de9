// The data-parallel ranks' checkpoints as one set (learner/checkpoint_set.h):
// a resume takes the newest step every rank completed, falling back from a
// half-written one and saying so, refuses when no step is complete; and a
// set resharded over another number of ranks loses no prompt and draws
// none twice.
#include "learner/checkpoint_set.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "learner/prompt_source.h"
#include "learner/run_state.h"

namespace kappa::learner {
namespace {

namespace fs = std::filesystem;

class CheckpointSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kappa_ckpt_set_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    base_ = pattern;
  }
  void TearDown() override { fs::remove_all(base_); }

  // Rank `rank`'s complete checkpoint of `step` (its trainer state), marked
  // latest in its run directory, written by `world_size` ranks.
  void Write(int64_t rank, int64_t step, int64_t world_size) {
    const std::string run_dir = RankRunDir(base_, rank);
    const std::string dir = CheckpointDir(run_dir, step);
    fs::create_directories(dir);
    TrainerState state;
    state.step = step;
    state.policy_version = step;
    state.world_size = world_size;
    state.data_position = 10 * step + rank;
    ASSERT_TRUE(WriteTrainerState(dir, state).ok());
    ASSERT_TRUE(MarkLatest(run_dir, dir).ok());
  }

  std::string base_;
};

TEST_F(CheckpointSetTest, NoCheckpointIsNoSet) {
  const auto set = FindCheckpointSet(base_, 2);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_FALSE(set->has_value());
}

TEST_F(CheckpointSetTest, EveryRanksNewestCompleteStepIsTheSet) {
  for (int64_t rank : {0, 1}) {
    Write(rank, 3, 2);
    Write(rank, 6, 2);
  }
  const auto set = FindCheckpointSet(base_, 2);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_TRUE(set->has_value());
  EXPECT_EQ((*set)->step, 6);
  EXPECT_EQ((*set)->world_size, 2);
  ASSERT_EQ((*set)->dirs.size(), 2u);
  EXPECT_EQ((*set)->dirs[1], base_ + "/rank-1/checkpoints/step-6");
  EXPECT_EQ((*set)->states[1].data_position, 61);
}

// Rank 1 died while the set of step 6 was being written: its step-6
// directory has the weights but no trainer state. Both resume from 3.
TEST_F(CheckpointSetTest, AHalfWrittenSetFallsBackToTheLastCompleteOne) {
  Write(0, 3, 2);
  Write(1, 3, 2);
  Write(0, 6, 2);
  fs::create_directories(CheckpointDir(RankRunDir(base_, 1), 6));
  const auto set = FindCheckpointSet(base_, 2);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_TRUE(set->has_value());
  EXPECT_EQ((*set)->step, 3);
}

TEST_F(CheckpointSetTest, NoCompleteStepIsRefusedNamingTheRank) {
  Write(0, 3, 2);  // rank 1 never wrote one
  const auto set = FindCheckpointSet(base_, 2);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(set.status().message().find("rank 1 has no complete checkpoint of step 3"),
            std::string::npos)
      << set.status();
}

// Rank 1's directory holds a checkpoint of another run (another seed) at
// the same step: refused, naming it, not mixed in.
TEST_F(CheckpointSetTest, ACheckpointOfAnotherRunIsRefusedByName) {
  Write(0, 3, 2);
  Write(1, 3, 2);
  const std::string other = CheckpointDir(RankRunDir(base_, 1), 3);
  TrainerState state;
  state.step = 3;
  state.policy_version = 3;
  state.world_size = 2;
  state.seed = 99;
  ASSERT_TRUE(WriteTrainerState(other, state).ok());
  const auto set = FindCheckpointSet(base_, 2);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("not of one run: " + other), std::string::npos)
      << set.status();
}

// The set is the ranks that wrote it, whatever the resuming run's number.
TEST_F(CheckpointSetTest, TheSetIsAsManyAsTheRanksThatWroteIt) {
  for (int64_t rank : {0, 1, 2}) Write(rank, 4, 3);
  const auto set = FindCheckpointSet(base_, 1);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_TRUE(set->has_value());
  EXPECT_EQ((*set)->world_size, 3);
  EXPECT_EQ((*set)->dirs.size(), 3u);
}

// Old ranks draw from one seeded sequence by their shares and leave some
// prompts pending; resharded over `new_world` ranks, which then draw on,
// every prompt of a prefix of the sequence is trained exactly once.
void ExpectEveryPromptOnce(int64_t old_world, const std::vector<int64_t>& positions,
                           int64_t new_world) {
  constexpr size_t kDataset = 1000;  // no epoch ends: a prompt is its place
  constexpr uint64_t kSeed = 17;
  CheckpointSet set;
  set.world_size = old_world;
  set.step = 5;
  std::multiset<int64_t> trained;
  for (int64_t k = 0; k < old_world; ++k) {
    PromptSource source(kDataset, kSeed, 0, static_cast<int>(k), static_cast<int>(old_world));
    TrainerState state;
    state.step = 5;
    state.policy_version = 5;
    state.data_position = positions[k];
    for (int64_t i = 0; i < positions[k]; ++i) {
      const int64_t prompt = static_cast<int64_t>(source.Next());
      // The last two drawn were still in flight at the checkpoint.
      if (i >= positions[k] - 2) {
        state.pending_prompts.push_back(prompt);
      } else {
        trained.insert(prompt);
      }
    }
    set.states.push_back(state);
  }
  int64_t new_position = -1;
  for (int64_t r = 0; r < new_world; ++r) {
    const auto state = ReshardTrainerState(set, kDataset, kSeed, r, new_world);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->world_size, new_world);
    EXPECT_EQ(state->step, 5);
    if (new_position < 0) new_position = state->data_position;
    EXPECT_EQ(state->data_position, new_position) << "every new rank starts at one position";
    trained.insert(state->pending_prompts.begin(), state->pending_prompts.end());
    PromptSource source(kDataset, kSeed, state->data_position, static_cast<int>(r),
                        static_cast<int>(new_world));
    for (int i = 0; i < 7; ++i) trained.insert(static_cast<int64_t>(source.Next()));
  }
  // Exactly the sequence's first (new position + 7) · new_world prompts.
  PromptSource sequence(kDataset, kSeed);
  std::multiset<int64_t> prefix;
  for (int64_t i = 0; i < (new_position + 7) * new_world; ++i) {
    prefix.insert(static_cast<int64_t>(sequence.Next()));
  }
  EXPECT_EQ(trained, prefix);
}

TEST(ReshardTrainerStateTest, NoPromptIsLostOrDrawnTwice) {
  {
    SCOPED_TRACE("2 → 1");
    ExpectEveryPromptOnce(2, {9, 7}, 1);
  }
  {
    SCOPED_TRACE("1 → 4");
    ExpectEveryPromptOnce(1, {13}, 4);
  }
  {
    SCOPED_TRACE("3 → 2, uneven");
    ExpectEveryPromptOnce(3, {4, 8, 5}, 2);
  }
  {
    SCOPED_TRACE("2 → 3");
    ExpectEveryPromptOnce(2, {6, 6}, 3);
  }
}

TEST(ReshardTrainerStateTest, RanksThatDisagreeOnTheStepAreRefused) {
  CheckpointSet set;
  set.world_size = 2;
  set.step = 4;
  set.states.resize(2);
  set.states[0].step = 4;
  set.states[1].step = 3;
  const auto state = ReshardTrainerState(set, 100, 1, 0, 1);
  ASSERT_FALSE(state.ok());
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("not of one run"), std::string::npos) << state.status();
}

}  // namespace
}  // namespace kappa::learner
