#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "learner/metrics_schema.h"

namespace kappa::cli {
namespace {

void ReadNumber(const nlohmann::json& record, const char* key, std::optional<double>& out) {
  auto it = record.find(key);
  if (it != record.end() && it->is_number()) out = it->get<double>();
}

void ReadInt(const nlohmann::json& record, const char* key, int64_t& out) {
  auto it = record.find(key);
  if (it != record.end() && it->is_number()) out = static_cast<int64_t>(it->get<double>());
}

std::string Fixed(const std::optional<double>& value, int decimals) {
  return value ? absl::StrFormat("%.*f", decimals, *value) : std::string("-");
}

// κ spans decades (0.01 under distillation-heavy mixing, 100 when drowning).
std::string Significant(const std::optional<double>& value) {
  return value ? absl::StrFormat("%.3g", *value) : std::string("-");
}

}  // namespace

void RunProgress::Update(const nlohmann::json& record) {
  ++records;
  ReadInt(record, metrics_jsonl::kStep, step);
  ReadInt(record, metrics_jsonl::kPolicyVersion, policy_version);
  ReadNumber(record, metrics_jsonl::kRewardMean, reward_mean);
  ReadNumber(record, metrics_jsonl::kLossReward, loss_reward);
  ReadNumber(record, metrics_jsonl::kLossDistill, loss_distill);
  ReadNumber(record, metrics_jsonl::kSamplesPerSecond, samples_per_second);
  ReadNumber(record, metrics_jsonl::kKappa, kappa);
  if (auto it = record.find(metrics_jsonl::kAlarmActive); it != record.end() && it->is_object()) {
    active_alarms.clear();
    for (const auto& [kind, active] : it->items()) {
      if (active.is_number() && active.get<double>() != 0) active_alarms.push_back(kind);
    }
  }
  if (auto it = record.find(metrics_jsonl::kAlarms); it != record.end() && it->is_array()) {
    for (const nlohmann::json& alarm : *it) {
      const std::string kind = alarm.value("kind", std::string("alarm"));
      const int64_t alarm_step = alarm.value("step", step);
      if (alarms_fired[kind]++ == 0) first_alarm_step[kind] = alarm_step;
      unshown_alarm_lines.push_back(absl::StrCat("step ", alarm_step, " ALARM ", kind, ": ",
                                                 alarm.value("message", std::string())));
    }
  }
  std::optional<double> eval;
  ReadNumber(record, metrics_jsonl::kEvalAccuracy, eval);
  if (eval) {
    if (!first_eval_accuracy) {
      first_eval_accuracy = eval;
      first_eval_step = step;
    }
    last_eval_accuracy = eval;
    last_eval_step = step;
  }
}

std::vector<std::string> RunProgress::TakeAlarmLines() {
  std::vector<std::string> lines(unshown_alarm_lines.begin(), unshown_alarm_lines.end());
  unshown_alarm_lines.clear();
  return lines;
}

std::string FormatDuration(double seconds) {
  const int64_t total = static_cast<int64_t>(seconds < 0 ? 0 : seconds);
  const int64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  return h > 0 ? absl::StrFormat("%d:%02d:%02d", h, m, s) : absl::StrFormat("%02d:%02d", m, s);
}

std::string FormatProgressLine(const RunProgress& p, double elapsed_seconds, int bar_width) {
  std::string line = absl::StrCat("step ", p.step, "/", p.total_steps);
  if (bar_width > 0) {
    const double frac =
        p.total_steps > 0 ? std::min(1.0, static_cast<double>(p.step) / p.total_steps) : 0.0;
    const int filled = static_cast<int>(frac * bar_width + 0.5);
    absl::StrAppend(&line, " [", std::string(filled, '#'), std::string(bar_width - filled, '-'),
                    "]");
  }
  absl::StrAppend(&line, " reward ", Fixed(p.reward_mean, 3), " | acc ",
                  Fixed(p.last_eval_accuracy, 3), " | L_R ", Fixed(p.loss_reward, 4), " | L_D ",
                  Fixed(p.loss_distill, 4), " | κ ", Significant(p.kappa), " | ",
                  Fixed(p.samples_per_second, 1), " samples/s | v", p.policy_version, " | ",
                  FormatDuration(elapsed_seconds));
  if (!p.active_alarms.empty()) absl::StrAppend(&line, " | ALARM ", absl::StrJoin(p.active_alarms, ","));
  return line;
}

bool ProgressDisplay::StderrIsTty() { return isatty(STDERR_FILENO) == 1; }

void ProgressDisplay::Show(RunProgress& progress, double elapsed_seconds) {
  for (const std::string& alarm : progress.TakeAlarmLines()) {
    // On a TTY the bar is erased first and redrawn below the alarm.
    std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[2K" : "", alarm.c_str());
    line_open_ = false;
  }
  if (tty_) {
    // \r + erase-line: redraw in place without scrolling.
    std::fprintf(stderr, "\r\033[2K%s", FormatProgressLine(progress, elapsed_seconds).c_str());
    std::fflush(stderr);
    line_open_ = true;
    return;
  }
  const bool new_eval = progress.last_eval_step != last_eval_shown_;
  const bool new_step = progress.step != last_step_shown_;
  if (!new_step || (!new_eval && elapsed_seconds - last_plain_ < interval_ &&
                    progress.step < progress.total_steps)) {
    return;
  }
  std::fprintf(stderr, "%s\n", FormatProgressLine(progress, elapsed_seconds, 0).c_str());
  std::fflush(stderr);
  last_plain_ = elapsed_seconds;
  last_step_shown_ = progress.step;
  last_eval_shown_ = progress.last_eval_step;
}

void ProgressDisplay::Finish() {
  if (line_open_) {
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
    line_open_ = false;
  }
}

}  // namespace kappa::cli
