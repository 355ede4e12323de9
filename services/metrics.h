// The process's Prometheus metrics (text exposition format 0.0.4): one
// Registry per process, families of counters, gauges and fixed-bucket
// histograms, each child identified by its label values. prometheus-cpp is
// not in our package sources, so this is ours; it is proved against
// `promtool check metrics` in tests.
//
// Thread safety: every operation may be called from any thread. Children are
// created on first use and live as long as the registry, so callers may keep
// the returned references.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kappa::services::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;  // name → value, in order

class Counter {
 public:
  void Increment(double amount = 1.0);  // amount < 0 is ignored (counters only go up)
  // For a counter that mirrors a monotonic total kept elsewhere (read at
  // scrape time): takes `total` unless it is smaller than the value already
  // exported, so the series never goes down.
  void SetTotal(double total);
  double value() const;

 private:
  mutable absl::Mutex mu_;
  double value_ ABSL_GUARDED_BY(mu_) = 0.0;
};

class Gauge {
 public:
  void Set(double value);
  void Add(double amount);
  double value() const;

 private:
  mutable absl::Mutex mu_;
  double value_ ABSL_GUARDED_BY(mu_) = 0.0;
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, strictly increasing and finite
  // (+Inf is implicit).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (= count)
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative; last is +Inf
  double sum_ ABSL_GUARDED_BY(mu_) = 0.0;
};

class Registry {
 public:
  // Get or create the child of family `name` with `labels`. A family keeps
  // the type, help, label names and (histograms) bounds of its first use;
  // a later use that differs, or an invalid name, throws std::invalid_argument
  // (a programming error, found by the first scrape in tests).
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // `hook` runs at the start of every Serialize(), on the scraping thread,
  // without the registry's lock held: the place to copy state that lives
  // elsewhere (a queue's depth, a coordinator's totals) into gauges and
  // counters, so a scrape sees it fresh even when nothing else updates it.
  // Hooks must be thread-safe and must outlive the registry's last scrape.
  void AddCollectHook(std::function<void()> hook) ABSL_LOCKS_EXCLUDED(hooks_mu_);

  // Every family in name order, children in label order.
  std::string Serialize() const ABSL_LOCKS_EXCLUDED(hooks_mu_, mu_);

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::vector<double> bounds;
    std::map<std::vector<std::string>, std::unique_ptr<Counter>> counters;
    std::map<std::vector<std::string>, std::unique_ptr<Gauge>> gauges;
    std::map<std::vector<std::string>, std::unique_ptr<Histogram>> histograms;
  };
  Family& FamilyFor(const std::string& name, Type type, const std::string& help,
                    const Labels& labels, const std::vector<double>& bounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  // Separate from mu_: hooks call back into Get*().
  mutable absl::Mutex hooks_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<std::function<void()>> hooks_ ABSL_GUARDED_BY(hooks_mu_);
};

// A number as the exposition format writes it: shortest round-trip decimal,
// "NaN", "+Inf", "-Inf".
std::string FormatValue(double value);
// A label value with \, " and newline escaped.
std::string EscapeLabelValue(const std::string& value);

}  // namespace kappa::services::metrics
