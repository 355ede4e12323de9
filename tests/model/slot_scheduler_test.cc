// SlotScheduler and SlotTable without a model: what joins the decode, and
// where its rows go.
#include "model/slot_scheduler.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace kappa::model {
namespace {

// Two distinct models for the version rule (their addresses are the keys).
const int kModelA = 0;
const int kModelB = 1;
const ModelKey kA = &kModelA;
const ModelKey kB = &kModelB;

SlotScheduler Scheduler(int64_t slots, int64_t max_prefill_tokens = 0) {
  return SlotScheduler(SlotSchedulerOptions{slots, max_prefill_tokens});
}

TEST(SlotTableTest, AcquireAndReleaseCheckTheirPreconditions) {
  SlotTable table(3);
  EXPECT_EQ(table.LowestFree(), 0);
  table.Acquire(0);
  table.Acquire(2);
  EXPECT_EQ(table.used(), 2);
  EXPECT_EQ(table.LowestFree(), 1);
  EXPECT_EQ(table.UsedEnd(), 3);
  EXPECT_THROW(table.Acquire(2), std::logic_error);   // already used
  EXPECT_THROW(table.Release(1), std::logic_error);   // not used
  EXPECT_THROW(table.Acquire(3), std::logic_error);   // outside the table
  EXPECT_THROW(table.Release(-1), std::logic_error);  // outside the table
  table.Acquire(1);
  EXPECT_THROW(table.LowestFree(), std::logic_error);  // full
  table.Release(0);
  EXPECT_EQ(table.LowestFree(), 0);
  table.ReleaseAll();
  EXPECT_EQ(table.free(), 3);
  EXPECT_EQ(table.UsedEnd(), 0);
  EXPECT_THROW(SlotTable(0), std::logic_error);
}

TEST(SlotSchedulerTest, AdmitsOldestFirstIntoTheLowestSlots) {
  SlotScheduler scheduler = Scheduler(4);
  scheduler.Enqueue(7, kA, 2, 5);
  scheduler.Enqueue(8, kA, 1, 3);
  const AdmissionPlan plan = scheduler.Schedule();
  EXPECT_EQ(plan.prefill, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(plan.placements, (std::vector<RowPlacement>{{0, 7, 0}, {1, 7, 1}, {2, 8, 0}}));
  EXPECT_EQ(scheduler.active_rows(), 3);
  EXPECT_EQ(scheduler.model_in_use(), kA);
  EXPECT_TRUE(scheduler.Schedule().empty());  // nothing waits
}

TEST(SlotSchedulerTest, AnotherModelWaitsUntilEveryRowOfTheCurrentOneFinished) {
  SlotScheduler scheduler = Scheduler(4);
  scheduler.Enqueue(1, kA, 2, 4);
  scheduler.Enqueue(2, kB, 1, 4);
  scheduler.Enqueue(3, kA, 1, 4);  // behind the other model's request: waits too
  AdmissionPlan plan = scheduler.Schedule();
  EXPECT_EQ(plan.prefill, (std::vector<int64_t>{1}));  // free slots remain, yet 2 waits
  EXPECT_EQ(scheduler.waiting_requests(), 2);
  scheduler.Finish(0);
  EXPECT_TRUE(scheduler.Schedule().empty());  // one row of model A still decodes
  scheduler.Finish(1);
  plan = scheduler.Schedule();
  EXPECT_EQ(plan.prefill, (std::vector<int64_t>{2}));
  EXPECT_EQ(plan.placements, (std::vector<RowPlacement>{{0, 2, 0}}));
  EXPECT_EQ(scheduler.model_in_use(), kB);
  scheduler.Finish(0);
  plan = scheduler.Schedule();
  EXPECT_EQ(plan.prefill, (std::vector<int64_t>{3}));
  EXPECT_EQ(scheduler.model_in_use(), kA);
}

TEST(SlotSchedulerTest, ModelsDoNotMixWithinOneAdmission) {
  SlotScheduler scheduler = Scheduler(4);
  scheduler.Enqueue(1, kA, 1, 4);
  scheduler.Enqueue(2, kB, 1, 4);  // the table is empty, but request 1 was just taken
  EXPECT_EQ(scheduler.Schedule().prefill, (std::vector<int64_t>{1}));
}

TEST(SlotSchedulerTest, PrefillCapSplitsAdmissions) {
  SlotScheduler scheduler = Scheduler(8, /*max_prefill_tokens=*/10);
  scheduler.Enqueue(1, kA, 1, 6);
  scheduler.Enqueue(2, kA, 1, 4);   // 6 + 4 = 10: within the cap
  scheduler.Enqueue(3, kA, 1, 1);   // 11: next time
  scheduler.Enqueue(4, kA, 1, 30);  // longer than the cap: prefilled alone
  scheduler.Enqueue(5, kA, 1, 1);
  EXPECT_EQ(scheduler.Schedule().prefill, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(scheduler.Schedule().prefill, (std::vector<int64_t>{3}));
  EXPECT_EQ(scheduler.Schedule().prefill, (std::vector<int64_t>{4}));
  EXPECT_EQ(scheduler.Schedule().prefill, (std::vector<int64_t>{5}));
}

TEST(SlotSchedulerTest, AFinishedRowsSlotIsReused) {
  SlotScheduler scheduler = Scheduler(3);
  scheduler.Enqueue(1, kA, 3, 2);
  scheduler.Schedule();
  scheduler.Finish(1);
  scheduler.Enqueue(2, kA, 1, 2);
  const AdmissionPlan plan = scheduler.Schedule();
  EXPECT_EQ(plan.placements, (std::vector<RowPlacement>{{1, 2, 0}}));
  EXPECT_THROW(scheduler.Finish(1 + 3), std::logic_error);
}

TEST(SlotSchedulerTest, AFullTableAdmitsNothing) {
  SlotScheduler scheduler = Scheduler(2);
  scheduler.Enqueue(1, kA, 2, 2);
  scheduler.Enqueue(2, kA, 1, 2);
  EXPECT_EQ(scheduler.Schedule().prefill, (std::vector<int64_t>{1}));
  EXPECT_TRUE(scheduler.Schedule().empty());
  EXPECT_EQ(scheduler.waiting_requests(), 1);
  scheduler.Finish(0);
  scheduler.Finish(0 + 1);
  EXPECT_THROW(scheduler.Finish(0), std::logic_error);  // already free
  EXPECT_EQ(scheduler.Schedule().prefill, (std::vector<int64_t>{2}));
}

TEST(SlotSchedulerTest, APartlyPlacedRequestsRowsComeFirst) {
  SlotScheduler scheduler = Scheduler(3);
  scheduler.Enqueue(1, kA, 2, 2);
  scheduler.Enqueue(2, kA, 3, 2);  // gets one slot now, two later
  scheduler.Enqueue(3, kA, 1, 2);
  AdmissionPlan plan = scheduler.Schedule();
  EXPECT_EQ(plan.prefill, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(plan.placements, (std::vector<RowPlacement>{{0, 1, 0}, {1, 1, 1}, {2, 2, 0}}));
  scheduler.Finish(1);
  plan = scheduler.Schedule();  // request 3 waits: request 2 still has a row due
  EXPECT_TRUE(plan.prefill.empty());
  EXPECT_EQ(plan.placements, (std::vector<RowPlacement>{{1, 2, 1}}));
  scheduler.Finish(0);
  plan = scheduler.Schedule();
  EXPECT_TRUE(plan.prefill.empty());
  EXPECT_EQ(plan.placements, (std::vector<RowPlacement>{{0, 2, 2}}));
  scheduler.Finish(2);
  plan = scheduler.Schedule();
  EXPECT_EQ(plan.prefill, (std::vector<int64_t>{3}));
  EXPECT_EQ(plan.placements, (std::vector<RowPlacement>{{2, 3, 0}}));
}

TEST(SlotSchedulerTest, NotIdleWhileAPartlyPlacedRequestHasRowsDue) {
  SlotScheduler scheduler = Scheduler(2);
  scheduler.Enqueue(1, kA, 1, 2);
  scheduler.Enqueue(2, kA, 2, 2);
  scheduler.Schedule();
  scheduler.Finish(0);
  scheduler.Finish(1);  // every placed row finished at once
  EXPECT_FALSE(scheduler.Idle());
  EXPECT_EQ(scheduler.Schedule().placements, (std::vector<RowPlacement>{{0, 2, 1}}));
  scheduler.Finish(0);
  EXPECT_TRUE(scheduler.Idle());
}

TEST(SlotSchedulerTest, EnqueueChecksTheRequest) {
  SlotScheduler scheduler = Scheduler(2);
  EXPECT_THROW(scheduler.Enqueue(1, kA, 3, 2), std::logic_error);  // more rows than slots
  EXPECT_THROW(scheduler.Enqueue(1, kA, 0, 2), std::logic_error);
  EXPECT_THROW(scheduler.Enqueue(1, kA, 1, 0), std::logic_error);
  EXPECT_TRUE(scheduler.Idle());
  scheduler.Enqueue(1, kA, 1, 1);
  scheduler.Clear();
  EXPECT_TRUE(scheduler.Idle());
}

}  // namespace
}  // namespace kappa::model
