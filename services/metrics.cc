#include "services/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kappa::services::metrics {
namespace {

bool ValidName(const std::string& name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// {a="x",b="y"} plus an optional trailing le="...".
std::string LabelText(const std::vector<std::string>& names, const std::vector<std::string>& values,
                      const std::string& le = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!le.empty()) absl::StrAppend(&out, out.empty() ? "" : ",", "le=\"", le, "\"");
  return out.empty() ? "" : absl::StrCat("{", out, "}");
}

}  // namespace

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  for (int precision : {15, 16, 17}) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    double parsed = 0;
    if (absl::SimpleAtod(buffer, &parsed) && parsed == value) break;
  }
  return buffer;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Counter::Increment(double amount) {
  if (!(amount >= 0)) return;
  absl::MutexLock lock(&mu_);
  value_ += amount;
}

void Counter::SetTotal(double total) {
  absl::MutexLock lock(&mu_);
  if (total > value_) value_ = total;
}

double Counter::value() const {
  absl::MutexLock lock(&mu_);
  return value_;
}

void Gauge::Set(double value) {
  absl::MutexLock lock(&mu_);
  value_ = value;
}

void Gauge::Add(double amount) {
  absl::MutexLock lock(&mu_);
  value_ += amount;
}

double Gauge::value() const {
  absl::MutexLock lock(&mu_);
  return value_;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i] > bounds_[i - 1]))) {
      throw std::invalid_argument("histogram bounds must be finite and strictly increasing");
    }
  }
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::Observe(double value) {
  // A bucket counts values <= its bound; NaN lands in +Inf only.
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  absl::MutexLock lock(&mu_);
  ++counts_[std::isnan(value) ? bounds_.size() : bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum = sum_;
  return s;
}

Registry::Family& Registry::FamilyFor(const std::string& name, Type type, const std::string& help,
                                      const Labels& labels, const std::vector<double>& bounds) {
  if (!ValidName(name, /*allow_colon=*/true)) {
    throw std::invalid_argument("invalid metric name '" + name + "'");
  }
  std::vector<std::string> label_names;
  for (const auto& [label, value] : labels) {
    if (!ValidName(label, false) || label.rfind("__", 0) == 0 ||
        (type == Type::kHistogram && label == "le")) {
      throw std::invalid_argument("metric " + name + ": invalid label name '" + label + "'");
    }
    label_names.push_back(label);
  }
  auto [it, inserted] = families_.try_emplace(name);
  Family& family = it->second;
  if (inserted) {
    family.type = type;
    family.help = help;
    family.label_names = label_names;
    family.bounds = bounds;
  } else if (family.type != type || family.label_names != label_names ||
             (type == Type::kHistogram && family.bounds != bounds)) {
    throw std::invalid_argument("metric " + name +
                                " re-registered with another type, labels or buckets");
  }
  return family;
}

namespace {
std::vector<std::string> ValuesOf(const Labels& labels) {
  std::vector<std::string> values;
  for (const auto& [label, value] : labels) values.push_back(value);
  return values;
}
}  // namespace

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& child = FamilyFor(name, Type::kCounter, help, labels, {}).counters[ValuesOf(labels)];
  if (!child) child = std::make_unique<Counter>();
  return *child;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& child = FamilyFor(name, Type::kGauge, help, labels, {}).gauges[ValuesOf(labels)];
  if (!child) child = std::make_unique<Gauge>();
  return *child;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& child =
      FamilyFor(name, Type::kHistogram, help, labels, bounds).histograms[ValuesOf(labels)];
  if (!child) child = std::make_unique<Histogram>(bounds);
  return *child;
}

void Registry::AddCollectHook(std::function<void()> hook) {
  absl::MutexLock lock(&hooks_mu_);
  hooks_.push_back(std::move(hook));
}

std::string Registry::Serialize() const {
  {
    // Held across the hooks so two scrapes do not interleave their updates.
    absl::MutexLock hooks_lock(&hooks_mu_);
    for (const std::function<void()>& hook : hooks_) hook();
  }
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    const char* type = family.type == Type::kCounter ? "counter"
                       : family.type == Type::kGauge ? "gauge"
                                                     : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(family.help), "\n# TYPE ", name, " ",
                    type, "\n");
    for (const auto& [values, counter] : family.counters) {
      absl::StrAppend(&out, name, LabelText(family.label_names, values), " ",
                      FormatValue(counter->value()), "\n");
    }
    for (const auto& [values, gauge] : family.gauges) {
      absl::StrAppend(&out, name, LabelText(family.label_names, values), " ",
                      FormatValue(gauge->value()), "\n");
    }
    for (const auto& [values, histogram] : family.histograms) {
      const Histogram::Snapshot s = histogram->snapshot();
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        const std::string le = i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
        absl::StrAppend(&out, name, "_bucket", LabelText(family.label_names, values, le), " ",
                        s.cumulative[i], "\n");
      }
      absl::StrAppend(&out, name, "_sum", LabelText(family.label_names, values), " ",
                      FormatValue(s.sum), "\n", name, "_count",
                      LabelText(family.label_names, values), " ", s.count, "\n");
    }
  }
  return out;
}

}  // namespace kappa::services::metrics
