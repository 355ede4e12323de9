#include "teacher_server/teacher_metrics.h"

#include <vector>

namespace kappa::teacher {
namespace {

using services::metrics::Registry;

constexpr char kRequestsHelp[] = "Teacher calls handled, by method.";
constexpr char kErrorsHelp[] = "Teacher calls that returned an error, by method.";

// Score is a queue wait plus one batched forward (milliseconds on CPU for the
// demo model, up to seconds for a large teacher); Generate is a whole decode.
const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> buckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                              0.25,  0.5,    1,     2.5,  5,     10};
  return buckets;
}

services::metrics::Histogram& MethodSeconds(Registry& registry, const std::string& method) {
  return registry.GetHistogram("kappa_teacher_" + method + "_seconds",
                               "Wall time of one teacher " + method +
                                   " call (queue wait included).",
                               LatencyBuckets());
}

// Every series of a method exists (at 0) before its first call.
void RegisterMethod(Registry& registry, const std::string& method) {
  registry.GetCounter("kappa_teacher_requests_total", kRequestsHelp, {{"method", method}});
  registry.GetCounter("kappa_teacher_request_errors_total", kErrorsHelp, {{"method", method}});
  MethodSeconds(registry, method);
}

}  // namespace

TeacherMetrics::TeacherMetrics(Registry& registry)
    : registry_(registry),
      tokens_(
          registry.GetCounter("kappa_teacher_tokens_total", "Response positions scored (Score).")),
      batch_size_(registry.GetHistogram("kappa_teacher_batch_size",
                                        "Sequences per batched teacher forward.",
                                        {1, 2, 4, 8, 16, 32, 64, 128, 256, 512})),
      batch_seconds_(registry.GetHistogram("kappa_teacher_batch_seconds",
                                           "Wall time of one batched teacher forward.",
                                           LatencyBuckets())),
      queue_depth_(registry.GetGauge("kappa_teacher_queue_depth",
                                     "Sequences waiting in the batcher's queue.")),
      nonfinite_(registry.GetCounter(
          "kappa_teacher_nonfinite_logprobs_total",
          "Score calls refused because a log-prob the teacher computed was NaN or infinite.")) {
  RegisterMethod(registry, "score");
  RegisterMethod(registry, "generate");
}

void TeacherMetrics::RecordRequest(const std::string& method, double seconds, bool ok,
                                   int64_t positions) {
  registry_.GetCounter("kappa_teacher_requests_total", kRequestsHelp, {{"method", method}})
      .Increment();
  if (!ok) {
    registry_.GetCounter("kappa_teacher_request_errors_total", kErrorsHelp, {{"method", method}})
        .Increment();
  }
  MethodSeconds(registry_, method).Observe(seconds);
  if (ok) tokens_.Increment(static_cast<double>(positions));
}

void TeacherMetrics::RecordBatch(int64_t sequences, double seconds) {
  batch_size_.Observe(static_cast<double>(sequences));
  batch_seconds_.Observe(seconds);
}

void TeacherMetrics::SetQueueDepth(int64_t sequences) {
  queue_depth_.Set(static_cast<double>(sequences));
}

void TeacherMetrics::RecordNonFiniteScore() { nonfinite_.Increment(); }

}  // namespace kappa::teacher
