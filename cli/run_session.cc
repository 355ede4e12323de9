#include "cli/run_session.h"

#include <signal.h>

#include <cstdio>
#include <deque>
#include <map>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cli/free_port.h"
#include "cli/metrics_tail.h"
#include "cli/process_supervisor.h"
#include "cli/progress.h"
#include "cli/termination_signal.h"
#include "services/server.h"

namespace kappa::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(200);

void ReportDeath(const ExitEvent& event, const std::string& run_dir) {
  const std::string log = absl::StrCat(run_dir, "/logs/", event.name, ".log");
  std::cerr << "kappa run: " << event.name << " " << event.status.ToString()
            << " unexpectedly; last lines of " << log << ":\n"
            << LogTail(log) << std::flush;
}

class Session {
 public:
  Session(const LaunchPlan& plan, const SessionOptions& options)
      : plan_(plan),
        options_(options),
        start_(Clock::now()),
        metrics_(options.run_dir + "/metrics.jsonl"),
        display_(ProgressDisplay::StderrIsTty()) {
    outcome_.progress.total_steps = options.total_steps;
  }

  SessionOutcome Run() {
    outcome_.exit_code = Supervise();
    outcome_.wall_seconds = SecondsSince(start_);
    return outcome_;
  }

 private:
  // The exit code; every path out stops and reaps all children.
  int Supervise() {
    for (const ProcessSpec* spec : {&plan_.teacher, &plan_.verifier, &plan_.learner}) {
      if (!Spawn(*spec)) return Stop(1);
    }
    learner_pid_ = pids_.back();
    restartable_[pids_[0]] = &plan_.teacher;
    restartable_[pids_[1]] = &plan_.verifier;
    for (const ProcessSpec& rank : plan_.learner_ranks) {
      if (!Spawn(rank)) return Stop(1);
    }
    std::cout << "started teacher (" << options_.teacher_address << "), verifier ("
              << options_.verifier_address << "), learner (" << options_.learner_address
              << "); logs in " << options_.run_dir << "/logs/\n";
    for (const MetricsEndpoint& endpoint : plan_.metrics) {
      if (endpoint.job == "kappa-learner") {
        std::cout << "learner metrics: http://" << ConnectAddress(endpoint.address) << "/metrics"
                  << " (every process: " << options_.run_dir << "/prometheus.yml)\n";
      }
    }
    std::cout << std::flush;
    if (const int code = AwaitHealth(); code >= 0) return Stop(code);
    std::cout << absl::StrFormat("services healthy after %.1f s; starting %d rollout worker%s\n",
                                 SecondsSince(start_), plan_.workers.size(),
                                 plan_.workers.size() == 1 ? "" : "s")
              << std::flush;
    for (const ProcessSpec& worker : plan_.workers) {
      if (!Spawn(worker)) return Stop(1);
      restartable_[pids_.back()] = &worker;
    }
    return Stop(FollowTraining());
  }

  bool Spawn(const ProcessSpec& spec) {
    absl::StatusOr<pid_t> pid = supervisor_.Spawn(spec);
    if (!pid.ok()) {
      std::cerr << "kappa run: " << pid.status().message() << "\n";
      return false;
    }
    pids_.push_back(*pid);
    return true;
  }

  // -1 once teacher, verifier and learner are all SERVING; else an exit code.
  int AwaitHealth() {
    std::vector<std::pair<std::string, std::string>> pending = {
        {"teacher", ConnectAddress(options_.teacher_address)},
        {"verifier", ConnectAddress(options_.verifier_address)},
        {"learner", ConnectAddress(options_.learner_address)}};
    for (size_t i = 0; i < plan_.learner_ranks.size(); ++i) {
      pending.emplace_back(plan_.learner_ranks[i].name, plan_.learner_rank_addresses[i]);
    }
    const auto deadline = Clock::now() + options_.health_timeout;
    while (!pending.empty()) {
      if (TerminationSignal() != 0) return Interrupted();
      if (const int code = CheckChildren(/*training=*/false); code >= 0) return code;
      for (auto it = pending.begin(); it != pending.end();) {
        if (services::CheckHealth(it->second, absl::Seconds(1), options_.security).ok()) {
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      if (pending.empty()) break;
      if (Clock::now() > deadline) {
        std::vector<std::string> names;
        for (const auto& [name, address] : pending) {
          names.push_back(absl::StrCat(name, " (", address, ")"));
        }
        std::cerr << "kappa run: not healthy after " << options_.health_timeout.count()
                  << " s: " << absl::StrJoin(names, ", ") << "; see " << options_.run_dir
                  << "/logs/\n";
        return 1;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    return -1;
  }

  int FollowTraining() {
    while (true) {
      ShowProgress();
      if (TerminationSignal() != 0) return Interrupted();
      if (const int code = CheckChildren(/*training=*/true); code >= 0) return code;
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  void ShowProgress() {
    for (const nlohmann::json& record : metrics_.ReadNew()) outcome_.progress.Update(record);
    if (options_.show_progress && outcome_.progress.records > 0) {
      display_.Show(outcome_.progress, SecondsSince(start_));
    } else {
      // Without the bar, alarms are still worth a line each.
      for (const std::string& line : outcome_.progress.TakeAlarmLines()) {
        std::cerr << line << "\n" << std::flush;
      }
    }
  }

  // Restart rule: while training, a teacher, verifier or rollout worker that
  // dies (non-zero exit or a signal) is started again with the same command
  // line, up to kMaxRestarts times per process name; the workers reconnect
  // and the learner re-issues a dead worker's leases, so nothing is lost. A
  // learner rank is never restarted here (`kappa run --resume` does that),
  // nor is anything that fails while the run is still starting up.
  static constexpr int kMaxRestarts = 5;

  // True when `event` was a restartable process and it runs again.
  bool Restart(const ExitEvent& event) {
    const auto it = restartable_.find(event.pid);
    if (it == restartable_.end()) return false;
    const ProcessSpec* spec = it->second;
    restartable_.erase(it);
    int& restarts = restarts_[spec->name];
    display_.Finish();
    if (restarts >= kMaxRestarts) {
      std::cerr << "kappa run: " << spec->name << " died again after " << restarts
                << " restarts; giving up\n";
      return false;
    }
    ++restarts;
    std::cerr << "kappa run: " << spec->name << " " << event.status.ToString()
              << " during training; restarting it (restart " << restarts << " of "
              << kMaxRestarts << "; log " << spec->log_file << ")\n"
              << std::flush;
    absl::StatusOr<pid_t> pid = supervisor_.Spawn(*spec);
    if (!pid.ok()) {
      std::cerr << "kappa run: " << pid.status().message() << "\n";
      return false;
    }
    restartable_[*pid] = spec;
    ++outcome_.restarts;
    return true;
  }

  // -1 while everything runs; 0 when the learner finished; 1 on a failure.
  int CheckChildren(bool training) {
    std::vector<ExitEvent> polled = supervisor_.Poll();
    if (polled.empty()) return -1;
    std::vector<ExitEvent> events;
    for (const ExitEvent& event : polled) {
      if (event.pid == learner_pid_) {
        if (event.status.success() && training) return 0;
        display_.Finish();
        ReportDeath(event, options_.run_dir);
        return 1;
      }
      if (training && !event.status.success() && Restart(event)) continue;
      events.push_back(event);
    }
    if (events.empty()) return -1;
    // Another process went first. When the learner finishes it closes its
    // server, and workers may notice before its own exit is reaped; give it
    // a moment before calling the run failed.
    if (training) {
      if (std::optional<ExitStatus> learner =
              supervisor_.WaitFor(learner_pid_, std::chrono::seconds(5));
          learner && learner->success()) {
        return 0;
      }
    }
    display_.Finish();
    for (const ExitEvent& event : events) ReportDeath(event, options_.run_dir);
    return 1;
  }

  int Interrupted() {
    display_.Finish();
    std::cerr << "kappa run: interrupted (" << strsignal(TerminationSignal())
              << "); stopping all processes\n";
    return 130;
  }

  int Stop(int code) {
    if (supervisor_.running_count() > 0) {
      const std::vector<std::string> names = supervisor_.RunningNames();
      for (const ExitEvent& event : supervisor_.StopAll(options_.stop_grace)) {
        if (event.status.signal == SIGKILL) {
          std::cerr << "kappa run: " << event.name << " ignored SIGTERM for "
                    << options_.stop_grace.count() << " ms and was killed\n";
        }
      }
    }
    ShowProgress();  // the learner's last records
    display_.Finish();
    return code;
  }

  const LaunchPlan& plan_;
  const SessionOptions& options_;
  const Clock::time_point start_;
  ProcessSupervisor supervisor_;
  std::vector<pid_t> pids_;
  pid_t learner_pid_ = 0;
  std::map<pid_t, const ProcessSpec*> restartable_;  // running, restartable
  std::map<std::string, int> restarts_;              // by process name
  MetricsTail metrics_;
  ProgressDisplay display_;
  SessionOutcome outcome_;
};

}  // namespace

std::string LogTail(const std::string& path, int max_lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::StrCat("  | (cannot read ", path, ")\n");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - 64 * 1024);
  in.seekg(start);
  std::deque<std::string> lines;
  std::string line;
  bool first = start > 0;  // a partial first line when we seeked into the middle
  while (std::getline(in, line)) {
    if (first) {
      first = false;
      continue;
    }
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.pop_front();
  }
  if (lines.empty()) return "  | (empty)\n";
  std::string out;
  for (const std::string& l : lines) absl::StrAppend(&out, "  | ", l, "\n");
  return out;
}

SessionOutcome RunSession(const LaunchPlan& plan, const SessionOptions& options) {
  return Session(plan, options).Run();
}

}  // namespace kappa::cli
