// What `kappa run` shows while training: the latest learner metrics folded
// into one state, rendered as a one-line bar (TTY) or plain periodic lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kappa::cli {

struct RunProgress {
  int64_t total_steps = 0;
  int64_t step = 0;
  int64_t policy_version = 0;
  std::optional<double> reward_mean;
  std::optional<double> loss_reward;
  std::optional<double> loss_distill;
  std::optional<double> samples_per_second;
  std::optional<double> first_eval_accuracy;  // the "before" of the summary
  std::optional<int64_t> first_eval_step;
  std::optional<double> last_eval_accuracy;   // the "after"
  std::optional<int64_t> last_eval_step;
  std::optional<double> kappa;                 // the last measured κ
  std::vector<std::string> active_alarms;      // kinds active at the last step
  std::map<std::string, int64_t> alarms_fired;  // kind → times it fired
  std::map<std::string, int64_t> first_alarm_step;
  // One line per alarm that fired, "step 42 ALARM magnitude_drowning: ...",
  // until the display takes them (TakeAlarmLines).
  std::deque<std::string> unshown_alarm_lines;
  int64_t records = 0;

  // Folds one metrics.jsonl record in; missing or non-numeric keys leave the
  // previous value.
  void Update(const nlohmann::json& record);
  std::vector<std::string> TakeAlarmLines();
};

// "step 12/60 [####------] reward 0.42 | acc 0.31 | L_R 0.0123 | L_D 0.345 |
//  κ 0.15 | 23.1 samples/s | v12 | 00:42", then "| ALARM collapse" while an
// alarm is active (width-independent; `bar_width` 0: no bar).
std::string FormatProgressLine(const RunProgress& progress, double elapsed_seconds,
                               int bar_width = 20);
// "1:02:03" / "02:03".
std::string FormatDuration(double seconds);

// Seconds on the steady clock since `start`.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Writes progress lines to stderr: on a TTY one line redrawn in place; else a
// new line when at least `plain_interval_seconds` passed or an eval arrived.
// An alarm that fires gets a line of its own, at once, in both modes, so it
// stays on screen after the bar has moved on.
class ProgressDisplay {
 public:
  explicit ProgressDisplay(bool tty, double plain_interval_seconds = 10.0)
      : tty_(tty), interval_(plain_interval_seconds) {}
  static bool StderrIsTty();

  void Show(RunProgress& progress, double elapsed_seconds);
  // Ends the in-place line (TTY) so later output starts on a fresh line.
  void Finish();

 private:
  bool tty_;
  double interval_;
  double last_plain_ = -1e9;
  int64_t last_step_shown_ = -1;
  std::optional<int64_t> last_eval_shown_;
  bool line_open_ = false;
};

}  // namespace kappa::cli
