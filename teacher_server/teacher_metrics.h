// The teacher's Prometheus metrics (docs/metrics.md): request latency per
// method, how full the dynamic batcher's batches are, and how deep its queue
// is. Latency and batch size are the two numbers to tune
// teacher.max_batch_sequences / teacher.max_wait_ms against.
#pragma once

#include <cstdint>
#include <string>

#include "services/metrics.h"

namespace kappa::teacher {

class TeacherMetrics {
 public:
  explicit TeacherMetrics(services::metrics::Registry& registry);

  // One handled call of `method` ("score" | "generate"): wall time (queue
  // wait + forward) and, for Score, the response positions it scored.
  void RecordRequest(const std::string& method, double seconds, bool ok, int64_t positions);
  // One batcher batch: its sequences and the forward's wall time.
  void RecordBatch(int64_t sequences, double seconds);
  // Sequences waiting for a batch now (set at scrape time).
  void SetQueueDepth(int64_t sequences);
  // One Score call refused because the teacher's own log-probs were not
  // finite (kappa_teacher_nonfinite_logprobs_total).
  void RecordNonFiniteScore();

 private:
  services::metrics::Registry& registry_;
  services::metrics::Counter& tokens_;
  services::metrics::Histogram& batch_size_;
  services::metrics::Histogram& batch_seconds_;
  services::metrics::Gauge& queue_depth_;
  services::metrics::Counter& nonfinite_;
};

}  // namespace kappa::teacher
