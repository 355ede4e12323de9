#include "teacher_server/dynamic_batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace kappa::teacher {
namespace {

// A unit of `inputs`; the batch function writes outputs[i] = 2 * inputs[i] + 1.
class TestUnit final : public BatchUnit {
 public:
  explicit TestUnit(std::vector<int> in) : inputs(std::move(in)) {}
  int64_t num_sequences() const override { return static_cast<int64_t>(inputs.size()); }
  std::vector<int> inputs;
  std::vector<int> outputs;
};

// Records what every batch held.
struct BatchLog {
  absl::Mutex mu;
  std::vector<int64_t> batch_sequences ABSL_GUARDED_BY(mu);
  std::vector<int64_t> batch_units ABSL_GUARDED_BY(mu);
  std::vector<int> seen_inputs ABSL_GUARDED_BY(mu);
};

DynamicBatcher::BatchFn DoublingFn(BatchLog* log) {
  return [log](const std::vector<BatchUnit*>& units) {
    int64_t sequences = 0;
    for (BatchUnit* u : units) {
      auto* unit = static_cast<TestUnit*>(u);
      unit->outputs.clear();
      for (int x : unit->inputs) unit->outputs.push_back(2 * x + 1);
      sequences += unit->num_sequences();
      absl::MutexLock lock(&log->mu);
      log->seen_inputs.insert(log->seen_inputs.end(), unit->inputs.begin(), unit->inputs.end());
    }
    absl::MutexLock lock(&log->mu);
    log->batch_sequences.push_back(sequences);
    log->batch_units.push_back(static_cast<int64_t>(units.size()));
    return absl::OkStatus();
  };
}

std::unique_ptr<DynamicBatcher> MakeBatcher(const DynamicBatcherOptions& options,
                                            DynamicBatcher::BatchFn fn) {
  auto batcher = DynamicBatcher::Create(options, std::move(fn));
  EXPECT_TRUE(batcher.ok()) << batcher.status();
  return std::move(*batcher);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

void WaitUntilQueued(DynamicBatcher& batcher, int64_t sequences) {
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (batcher.stats().queued_sequences < sequences && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(batcher.stats().queued_sequences, sequences);
}

TEST(DynamicBatcherTest, RejectsBadOptions) {
  auto fn = [](const std::vector<BatchUnit*>&) { return absl::OkStatus(); };
  DynamicBatcherOptions options;
  options.max_batch_sequences = 0;
  EXPECT_EQ(DynamicBatcher::Create(options, fn).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.max_wait = absl::Milliseconds(-1);
  EXPECT_EQ(DynamicBatcher::Create(options, fn).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  EXPECT_EQ(DynamicBatcher::Create(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DynamicBatcherTest, ConcurrentCallersGetTheirOwnResults) {
  BatchLog log;
  DynamicBatcherOptions options;
  options.max_batch_sequences = 16;
  options.max_wait = absl::Milliseconds(20);
  auto batcher = MakeBatcher(options, DoublingFn(&log));

  constexpr int kThreads = 8;
  constexpr int kPerThread = 10;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kPerThread; ++r) {
        // Distinct inputs per caller and round, of varying sizes 1..3.
        std::vector<int> inputs;
        for (int j = 0; j <= (t + r) % 3; ++j) inputs.push_back(1000 * t + 10 * r + j);
        auto unit = std::make_shared<TestUnit>(inputs);
        absl::Status status = batcher->Submit(unit, Soon());
        if (!status.ok() || unit->outputs.size() != inputs.size()) {
          ++failures;
          continue;
        }
        for (size_t j = 0; j < inputs.size(); ++j) {
          if (unit->outputs[j] != 2 * inputs[j] + 1) ++failures;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);

  const DynamicBatcherStats stats = batcher->stats();
  EXPECT_EQ(stats.units, kThreads * kPerThread);
  // With 8 concurrent callers and a 20 ms window, units must have shared batches.
  EXPECT_LT(stats.batches, stats.units);
  absl::MutexLock lock(&log.mu);
  int64_t most_units = 0;
  for (int64_t u : log.batch_units) most_units = std::max(most_units, u);
  EXPECT_GT(most_units, 1);
}

TEST(DynamicBatcherTest, BatchNeverExceedsMaxSequences) {
  BatchLog log;
  DynamicBatcherOptions options;
  options.max_batch_sequences = 5;
  options.max_wait = absl::Milliseconds(30);
  auto batcher = MakeBatcher(options, DoublingFn(&log));

  std::vector<std::thread> threads;
  for (int t = 0; t < 12; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 4; ++r) {
        auto unit = std::make_shared<TestUnit>(std::vector<int>(1 + (t + r) % 3, t));
        EXPECT_TRUE(batcher->Submit(unit, Soon()).ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();

  absl::MutexLock lock(&log.mu);
  ASSERT_FALSE(log.batch_sequences.empty());
  int64_t largest = 0;
  for (int64_t n : log.batch_sequences) {
    EXPECT_LE(n, 5);
    largest = std::max(largest, n);
  }
  EXPECT_GE(largest, 4) << "12 concurrent callers should fill batches";
  EXPECT_EQ(batcher->stats().largest_batch, largest);
}

TEST(DynamicBatcherTest, OversizedUnitIsRefused) {
  BatchLog log;
  DynamicBatcherOptions options;
  options.max_batch_sequences = 2;
  auto batcher = MakeBatcher(options, DoublingFn(&log));
  auto unit = std::make_shared<TestUnit>(std::vector<int>{1, 2, 3});
  EXPECT_EQ(batcher->Submit(unit, Soon()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batcher->Submit(nullptr, Soon()).code(), absl::StatusCode::kInvalidArgument);
  auto empty = std::make_shared<TestUnit>(std::vector<int>{});
  EXPECT_EQ(batcher->Submit(empty, Soon()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DynamicBatcherTest, LoneUnitWaitsMaxWaitThenRuns) {
  BatchLog log;
  DynamicBatcherOptions options;
  options.max_batch_sequences = 100;
  options.max_wait = absl::Milliseconds(80);
  auto batcher = MakeBatcher(options, DoublingFn(&log));

  auto unit = std::make_shared<TestUnit>(std::vector<int>{7});
  const absl::Time start = absl::Now();
  ASSERT_TRUE(batcher->Submit(unit, Soon()).ok());
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(80));
  EXPECT_LT(waited, absl::Seconds(2));
  EXPECT_EQ(unit->outputs, std::vector<int>{15});
}

TEST(DynamicBatcherTest, FullBatchRunsWithoutWaiting) {
  BatchLog log;
  DynamicBatcherOptions options;
  options.max_batch_sequences = 4;
  options.max_wait = absl::Seconds(20);  // would blow the test timeout if waited
  auto batcher = MakeBatcher(options, DoublingFn(&log));

  const absl::Time start = absl::Now();
  std::thread first([&] {
    auto unit = std::make_shared<TestUnit>(std::vector<int>{1, 2});
    EXPECT_TRUE(batcher->Submit(unit, Soon() + absl::Seconds(20)).ok());
  });
  WaitUntilQueued(*batcher, 2);
  auto unit = std::make_shared<TestUnit>(std::vector<int>{3, 4});
  ASSERT_TRUE(batcher->Submit(unit, Soon() + absl::Seconds(20)).ok());
  first.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(unit->outputs, (std::vector<int>{7, 9}));
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.batch_sequences, std::vector<int64_t>{4});
}

// A batch function that blocks until released, to hold the batching thread.
struct Gate {
  absl::Notification entered;
  absl::Notification release;
  DynamicBatcher::BatchFn Fn(BatchLog* log) {
    auto inner = DoublingFn(log);
    return [this, inner](const std::vector<BatchUnit*>& units) {
      if (!entered.HasBeenNotified()) entered.Notify();
      release.WaitForNotification();
      return inner(units);
    };
  }
};

TEST(DynamicBatcherTest, ShutdownFailsQueuedCallersAndFinishesRunningBatch) {
  BatchLog log;
  Gate gate;
  DynamicBatcherOptions options;
  options.max_batch_sequences = 1;
  options.max_wait = absl::ZeroDuration();
  auto batcher = MakeBatcher(options, gate.Fn(&log));

  absl::Status running_status, queued_status[2];
  std::thread running([&] {
    running_status = batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{1}), Soon());
  });
  gate.entered.WaitForNotification();
  std::thread queued[2];
  for (int i = 0; i < 2; ++i) {
    queued[i] = std::thread([&, i] {
      queued_status[i] = batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{2}), Soon());
    });
  }
  WaitUntilQueued(*batcher, 2);

  std::thread shutdown([&] { batcher->Shutdown(); });
  // Queued callers are woken while the running batch is still blocked.
  for (auto& thread : queued) thread.join();
  EXPECT_FALSE(gate.release.HasBeenNotified());
  for (const absl::Status& status : queued_status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  }
  gate.release.Notify();
  running.join();
  shutdown.join();
  EXPECT_TRUE(running_status.ok()) << running_status;

  EXPECT_EQ(batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{3}), Soon()).code(),
            absl::StatusCode::kUnavailable);
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.seen_inputs, std::vector<int>{1});
}

TEST(DynamicBatcherTest, FullQueueIsResourceExhausted) {
  BatchLog log;
  Gate gate;
  DynamicBatcherOptions options;
  options.max_batch_sequences = 2;
  options.max_queued_sequences = 2;
  options.max_wait = absl::ZeroDuration();
  auto batcher = MakeBatcher(options, gate.Fn(&log));

  std::thread running([&] {
    EXPECT_TRUE(batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{1}), Soon()).ok());
  });
  gate.entered.WaitForNotification();
  std::thread queued([&] {
    EXPECT_TRUE(batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{2, 3}), Soon()).ok());
  });
  WaitUntilQueued(*batcher, 2);
  const absl::Status refused =
      batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{4}), Soon());
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(batcher->stats().rejected_full, 1);
  gate.release.Notify();
  running.join();
  queued.join();
}

TEST(DynamicBatcherTest, DeadlineWithdrawsQueuedUnit) {
  BatchLog log;
  Gate gate;
  DynamicBatcherOptions options;
  options.max_batch_sequences = 1;
  options.max_wait = absl::ZeroDuration();
  auto batcher = MakeBatcher(options, gate.Fn(&log));

  std::thread running([&] {
    EXPECT_TRUE(batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{1}), Soon()).ok());
  });
  gate.entered.WaitForNotification();
  const absl::Time start = absl::Now();
  const absl::Status late = batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{2}),
                                            absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(batcher->stats().queued_sequences, 0);
  gate.release.Notify();
  running.join();
  // The withdrawn unit never ran.
  ASSERT_TRUE(batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{3}), Soon()).ok());
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.seen_inputs, (std::vector<int>{1, 3}));
}

TEST(DynamicBatcherTest, BatchErrorsReachEveryCaller) {
  DynamicBatcherOptions options;
  options.max_batch_sequences = 8;
  options.max_wait = absl::Milliseconds(1);
  auto batcher = MakeBatcher(options, [](const std::vector<BatchUnit*>& units) -> absl::Status {
    if (static_cast<TestUnit*>(units[0])->inputs[0] < 0) throw std::runtime_error("boom");
    return absl::FailedPreconditionError("no model");
  });
  const absl::Status thrown =
      batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{-1}), Soon());
  EXPECT_EQ(thrown.code(), absl::StatusCode::kInternal);
  EXPECT_NE(thrown.message().find("boom"), std::string::npos) << thrown;
  // The batching thread survived the exception.
  EXPECT_EQ(batcher->Submit(std::make_shared<TestUnit>(std::vector<int>{1}), Soon()).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kappa::teacher
