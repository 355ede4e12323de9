#include "learner/coordinator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "learner/prompt_source.h"

namespace kappa::learner {
namespace {

ScoredGroup GroupAtVersion(int64_t version) {
  ScoredGroup group;
  group.prompt_tokens = {1, 5};
  group.policy_version = version;
  return group;
}

CoordinatorOptions Options(int64_t buffer, int64_t staleness, absl::Duration lease) {
  CoordinatorOptions options;
  options.buffer_groups = buffer;
  options.max_staleness = staleness;
  options.lease_timeout = lease;
  return options;
}

TEST(PromptSourceTest, EachEpochIsAPermutationAndResumeContinuesTheSequence) {
  PromptSource source(10, /*seed=*/7);
  std::vector<size_t> drawn;
  for (int i = 0; i < 25; ++i) drawn.push_back(source.Next());
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<size_t> seen(drawn.begin() + epoch * 10, drawn.begin() + epoch * 10 + 10);
    EXPECT_EQ(seen.size(), 10u) << "epoch " << epoch;
  }
  PromptSource resumed(10, 7, /*position=*/13);
  for (int i = 13; i < 25; ++i) EXPECT_EQ(resumed.Next(), drawn[i]) << i;
}

TEST(CoordinatorTest, LeasesAreBoundedByCapacityAndPerWorkerLimit) {
  Coordinator coordinator(100, 1, 0, Options(3, 2, absl::Seconds(30)));
  const absl::Time soon = absl::Now() + absl::Milliseconds(50);
  ASSERT_TRUE(coordinator.LeaseNext("a", 2, soon));
  ASSERT_TRUE(coordinator.LeaseNext("a", 2, soon));
  EXPECT_FALSE(coordinator.LeaseNext("a", 2, absl::Now() + absl::Milliseconds(50)))
      << "worker a holds its limit of 2";
  ASSERT_TRUE(coordinator.LeaseNext("b", 2, soon));
  EXPECT_FALSE(coordinator.LeaseNext("b", 2, absl::Now() + absl::Milliseconds(50)))
      << "3 slots are all in use";
  EXPECT_EQ(coordinator.counters().outstanding, 3);
}

TEST(CoordinatorTest, GroupIsAcceptedOnceAndOnlyForItsOwnLease) {
  Coordinator coordinator(100, 1, 0, Options(8, 2, absl::Seconds(30)));
  auto lease = coordinator.LeaseNext("a", 4, absl::InfiniteFuture());
  ASSERT_TRUE(lease);
  EXPECT_EQ(coordinator.Submit(lease->lease_id, "b", GroupAtVersion(0)),
            SubmitVerdict::kWrongWorker);
  EXPECT_EQ(coordinator.Submit(lease->lease_id, "a", GroupAtVersion(0)),
            SubmitVerdict::kAccepted);
  // The same lease's group again (a replaying worker) is a duplicate, from
  // any stream; a lease never issued stays unknown.
  EXPECT_EQ(coordinator.Submit(lease->lease_id, "a", GroupAtVersion(0)), SubmitVerdict::kDuplicate);
  EXPECT_EQ(coordinator.Submit(lease->lease_id, "b", GroupAtVersion(0)), SubmitVerdict::kDuplicate);
  EXPECT_EQ(coordinator.Submit("never-issued", "a", GroupAtVersion(0)),
            SubmitVerdict::kUnknownLease);
  auto batch = coordinator.TakeBatch(1, 0, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0].lease_id, lease->lease_id);
  EXPECT_EQ(batch[0].example_index, lease->example_index);
  // Still a duplicate once the group was trained on.
  EXPECT_EQ(coordinator.Submit(lease->lease_id, "a", GroupAtVersion(0)), SubmitVerdict::kDuplicate);
  EXPECT_EQ(coordinator.counters().groups_consumed, 1);
  EXPECT_EQ(coordinator.counters().dropped_duplicate, 3);
  EXPECT_EQ(coordinator.counters().dropped_unknown_lease, 2);  // another worker's, never issued
}

TEST(CoordinatorTest, ClosedLeasesAreRememberedUpToTheBound) {
  Coordinator coordinator(100, 1, 0, Options(8, 2, absl::Seconds(30)));
  std::vector<std::string> closed;
  for (size_t i = 0; i < kClosedLeaseMemory + 1; ++i) {
    auto lease = coordinator.LeaseNext("a", 1, absl::InfiniteFuture());
    ASSERT_TRUE(lease);
    ASSERT_EQ(coordinator.Submit(lease->lease_id, "a", GroupAtVersion(0)),
              SubmitVerdict::kAccepted);
    ASSERT_EQ(coordinator.TakeBatch(1, 0, absl::InfiniteFuture()).size(), 1u);
    if (i < 2 || i + 2 > kClosedLeaseMemory) closed.push_back(lease->lease_id);
  }
  // The oldest fell out of the bounded record: unknown now, not a duplicate.
  EXPECT_EQ(coordinator.Submit(closed[0], "a", GroupAtVersion(0)), SubmitVerdict::kUnknownLease);
  for (size_t i = 1; i < closed.size(); ++i) {
    EXPECT_EQ(coordinator.Submit(closed[i], "a", GroupAtVersion(0)), SubmitVerdict::kDuplicate)
        << closed[i];
  }
}

TEST(CoordinatorTest, ExpiredLeaseIsReissuedAndItsLateGroupDropped) {
  Coordinator coordinator(100, 1, 0, Options(8, 2, absl::Milliseconds(50)));
  auto first = coordinator.LeaseNext("a", 4, absl::InfiniteFuture());
  ASSERT_TRUE(first);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  auto second = coordinator.LeaseNext("b", 4, absl::InfiniteFuture());
  ASSERT_TRUE(second);
  EXPECT_EQ(second->example_index, first->example_index) << "the expired prompt comes back first";
  EXPECT_NE(second->lease_id, first->lease_id);
  EXPECT_EQ(coordinator.Submit(first->lease_id, "a", GroupAtVersion(0)),
            SubmitVerdict::kUnknownLease);
  EXPECT_EQ(coordinator.counters().leases_reissued, 1);
}

// Issue 45: four idle streams take every slot and answer nothing. Once
// their leases expire they are leased nothing for a lease timeout (before,
// each took an expired lease back at its next ask and training stalled): a
// working stream gets the slots and the prompts. An idle stream that speaks
// again (a group, even a late one, or a renewal) is leased again; one that
// stays silent is on probation after the timeout: one lease at a time.
TEST(CoordinatorTest, IdleStreamsLoseTheirSlotsToWorkingOnes) {
  const absl::Duration lease_timeout = absl::Milliseconds(500);
  Coordinator coordinator(100, 1, 0, Options(8, 2, lease_timeout));
  std::map<std::string, std::vector<Lease>> held;
  for (int i = 0; i < 4; ++i) {
    const std::string idle = "idle-" + std::to_string(i);
    for (int k = 0; k < 2; ++k) {
      auto lease = coordinator.LeaseNext(idle, 2, absl::Now() + absl::Milliseconds(10));
      ASSERT_TRUE(lease) << idle;
      held[idle].push_back(*lease);
    }
  }
  EXPECT_FALSE(coordinator.LeaseNext("worker", 8, absl::Now() + absl::Milliseconds(10)))
      << "all 8 slots are held";
  absl::SleepFor(lease_timeout + absl::Milliseconds(50));
  // The idle streams ask first, as they would in a tight loop; the first ask
  // notices the expiry, so each is silent for a lease timeout from here.
  const absl::Time silenced = absl::Now();
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(
        coordinator.LeaseNext("idle-" + std::to_string(i), 2, absl::Now() + absl::Milliseconds(5)))
        << "a silent stream took a slot back";
  }
  EXPECT_EQ(coordinator.counters().streams_silenced, 4);
  std::set<size_t> expired;
  for (const auto& [idle, leases] : held) {
    for (const Lease& lease : leases) expired.insert(lease.example_index);
  }
  std::set<size_t> taken;
  for (int k = 0; k < 8; ++k) {
    auto lease = coordinator.LeaseNext("worker", 8, absl::Now() + absl::Milliseconds(10));
    ASSERT_TRUE(lease) << k;
    taken.insert(lease->example_index);
    ASSERT_EQ(coordinator.Submit(lease->lease_id, "worker", GroupAtVersion(0)),
              SubmitVerdict::kAccepted);
  }
  EXPECT_EQ(taken, expired) << "the working stream got the expired prompts";
  EXPECT_EQ(coordinator.TakeBatch(8, 0, absl::Now() + absl::Seconds(1)).size(), 8u);
  ASSERT_LT(absl::Now() - silenced, lease_timeout) << "too slow to tell silence from probation";
  // A late group from idle-0 is dropped, but idle-0 is heard: it is leased
  // again, up to its own limit; idle-1 renews and is leased again too.
  EXPECT_EQ(coordinator.Submit(held["idle-0"][0].lease_id, "idle-0", GroupAtVersion(0)),
            SubmitVerdict::kUnknownLease);
  EXPECT_TRUE(coordinator.LeaseNext("idle-0", 2, absl::Now() + absl::Milliseconds(10)));
  EXPECT_TRUE(coordinator.LeaseNext("idle-0", 2, absl::Now() + absl::Milliseconds(10)));
  coordinator.Renew({}, "idle-1");
  EXPECT_TRUE(coordinator.LeaseNext("idle-1", 2, absl::Now() + absl::Milliseconds(10)));
  EXPECT_FALSE(coordinator.LeaseNext("idle-2", 2, absl::Now() + absl::Milliseconds(5)));
  // After its silence, idle-2 is on probation: one lease, not two.
  absl::SleepFor(lease_timeout - (absl::Now() - silenced) + absl::Milliseconds(20));
  EXPECT_TRUE(coordinator.LeaseNext("idle-2", 2, absl::Now() + absl::Milliseconds(10)));
  EXPECT_FALSE(coordinator.LeaseNext("idle-2", 2, absl::Now() + absl::Milliseconds(5)))
      << "a stream on probation holds one lease at a time";
}

// A lease its worker keeps renewing outlives its timeout many times over
// (issue 38: a 0.5B group takes minutes on a CPU); renewals by another
// worker, of unknown ids or of an expired lease change nothing.
TEST(CoordinatorTest, ARenewedLeaseOutlivesItsTimeoutAndOnlyItsWorkerRenewsIt) {
  Coordinator coordinator(100, 1, 0, Options(8, 2, absl::Milliseconds(100)));
  auto kept = coordinator.LeaseNext("a", 4, absl::InfiniteFuture());
  auto lapsed = coordinator.LeaseNext("a", 4, absl::InfiniteFuture());
  ASSERT_TRUE(kept && lapsed);
  for (int i = 0; i < 6; ++i) {  // 300 ms: three timeouts
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const Coordinator::Renewal renewal = coordinator.Renew({kept->lease_id, "no-such-lease"}, "a");
    ASSERT_EQ(renewal.lease_ids, std::vector<std::string>{kept->lease_id}) << "round " << i;
    EXPECT_GT(renewal.deadline, absl::Now() + absl::Milliseconds(50));
    EXPECT_TRUE(coordinator.Renew({lapsed->lease_id}, "b").lease_ids.empty());
  }
  EXPECT_TRUE(coordinator.Renew({lapsed->lease_id}, "a").lease_ids.empty()) << "expired";
  EXPECT_EQ(coordinator.counters().leases_reissued, 1);
  EXPECT_EQ(coordinator.counters().leases_renewed, 6);
  EXPECT_EQ(coordinator.Submit(kept->lease_id, "a", GroupAtVersion(0)), SubmitVerdict::kAccepted);
  EXPECT_EQ(coordinator.Submit(lapsed->lease_id, "a", GroupAtVersion(0)),
            SubmitVerdict::kUnknownLease);
}

TEST(CoordinatorTest, DisconnectedWorkersLeasesAreReissuedImmediately) {
  Coordinator coordinator(100, 1, 0, Options(8, 2, absl::Seconds(30)));
  auto lease = coordinator.LeaseNext("a", 4, absl::InfiniteFuture());
  ASSERT_TRUE(lease);
  coordinator.ReleaseWorker("a");
  auto again = coordinator.LeaseNext("b", 4, absl::InfiniteFuture());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->example_index, lease->example_index);
}

TEST(CoordinatorTest, StaleGroupsAreDroppedAndCounted) {
  Coordinator coordinator(100, 1, 0, Options(8, /*max_staleness=*/1, absl::Seconds(30)));
  for (int64_t version : {3, 5, 4}) {
    auto lease = coordinator.LeaseNext("a", 8, absl::InfiniteFuture());
    ASSERT_TRUE(lease);
    ASSERT_EQ(coordinator.Submit(lease->lease_id, "a", GroupAtVersion(version)),
              SubmitVerdict::kAccepted);
  }
  auto batch = coordinator.TakeBatch(2, /*current_version=*/5, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].group.policy_version, 5);
  EXPECT_EQ(batch[1].group.policy_version, 4);
  EXPECT_EQ(coordinator.counters().dropped_stale, 1);
}

TEST(CoordinatorTest, TakeBatchWaitsForProducersAndShutdownWakesIt) {
  Coordinator coordinator(100, 1, 0, Options(8, 2, absl::Seconds(30)));
  std::thread producer([&] {
    for (int i = 0; i < 2; ++i) {
      auto lease = coordinator.LeaseNext("a", 8, absl::InfiniteFuture());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      coordinator.Submit(lease->lease_id, "a", GroupAtVersion(0));
    }
  });
  auto batch = coordinator.TakeBatch(2, 0, absl::Now() + absl::Seconds(5));
  producer.join();
  EXPECT_EQ(batch.size(), 2u);

  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    coordinator.Shutdown();
  });
  const absl::Time start = absl::Now();
  EXPECT_TRUE(coordinator.TakeBatch(1, 0, absl::InfiniteFuture()).empty());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  stopper.join();
}

}  // namespace
}  // namespace kappa::learner
