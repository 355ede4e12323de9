#include "cli/run_session.h"

#include <signal.h>

#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cli/free_port.h"
#include "cli/metrics_tail.h"
#include "cli/process_supervisor.h"
#include "cli/progress.h"
#include "cli/restart_budget.h"
#include "cli/termination_signal.h"
#include "services/atomic_file.h"
#include "services/ready_file.h"
#include "services/server.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(200);
constexpr auto kReadyPollInterval = std::chrono::milliseconds(50);

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
    std::vector<std::string> servers;  // the processes with a gRPC server
    for (const ServiceProcess* service : {&plan_.teacher, &plan_.verifier, &plan_.learner}) {
      if (!Spawn(*service, service->spec)) return Stop(1);
      servers.push_back(service->spec.name);
    }
    learner_pid_ = pids_[plan_.learner.spec.name];
    restartable_[pids_[plan_.teacher.spec.name]] = plan_.teacher.spec.name;
    restartable_[pids_[plan_.verifier.spec.name]] = plan_.verifier.spec.name;
    for (const ServiceProcess& rank : plan_.learner_ranks) {
      if (!Spawn(rank, rank.spec)) return Stop(1);
      servers.push_back(rank.spec.name);
    }
    if (const int code = AwaitReady(servers); code >= 0) return Stop(code);
    std::cout << "started teacher (" << Address("teacher") << "), verifier (" << Address("verifier")
              << "), learner (" << Address("learner") << "); logs in " << options_.run_dir
              << "/logs/\n";
    if (const std::string metrics = ready_["learner"].metrics_address; !metrics.empty()) {
      std::cout << "learner metrics: http://" << ConnectAddress(metrics) << "/metrics"
                << " (every process: " << options_.run_dir << "/prometheus.yml)\n";
    }
    std::cout << std::flush;
    if (const int code = AwaitHealth(servers); code >= 0) return Stop(code);
    std::cout << absl::StrFormat("services healthy after %.1f s; starting %d rollout worker%s\n",
                                 SecondsSince(start_), plan_.workers.size(),
                                 plan_.workers.size() == 1 ? "" : "s")
              << std::flush;
    const size_t ranks = 1 + plan_.learner_ranks.size();
    std::vector<std::string> names;
    for (size_t i = 0; i < plan_.workers.size(); ++i) {
      const std::string learner = i % ranks == 0
                                      ? Address("learner")
                                      : Address(plan_.learner_ranks[i % ranks - 1].spec.name);
      const ServiceProcess& worker = plan_.workers[i];
      if (!Spawn(worker, WorkerSpec(worker, Address("teacher"), Address("verifier"), learner))) {
        return Stop(1);
      }
      restartable_[pids_[worker.spec.name]] = worker.spec.name;
      names.push_back(worker.spec.name);
    }
    // A worker reports once its /metrics is up, before it asks for work;
    // prometheus.yml follows within a poll interval (on a toy run the first
    // steps may already be trained by then).
    if (const int code = AwaitReady(names, /*training=*/true); code >= 0) return Stop(code);
    WritePrometheusConfig();
    return Stop(FollowTraining());
  }

  // Starts `spec` as `service`'s process, with no ready file of an earlier
  // process left for it to be mistaken for.
  bool Spawn(const ServiceProcess& service, const ProcessSpec& spec) {
    std::error_code ignored;
    fs::create_directories(fs::path(service.ready_file).parent_path(), ignored);
    fs::remove(service.ready_file, ignored);
    absl::StatusOr<pid_t> pid = supervisor_.Spawn(spec);
    if (!pid.ok()) {
      std::cerr << "kappa run: " << pid.status().message() << "\n";
      return false;
    }
    services_[spec.name] = &service;
    specs_[spec.name] = spec;
    pids_[spec.name] = *pid;
    started_[spec.name] = Clock::now();
    return true;
  }

  // The gRPC address `name` reported (ConnectAddress form).
  std::string Address(const std::string& name) { return ConnectAddress(ready_[name].address); }

  // True once `name`'s process has written its ready file (recorded in
  // ready_; a restart keeps what the first run reported); an error for a
  // file that is not a ready file.
  absl::StatusOr<bool> CollectReady(const std::string& name) {
    if (ready_.count(name) > 0) return true;
    absl::StatusOr<services::ReadyInfo> info = services::ReadReadyFile(services_[name]->ready_file);
    if (absl::IsNotFound(info.status())) return false;
    if (!info.ok()) return info.status();
    if (info->pid != pids_[name]) return false;  // not from the process running now
    ready_[name] = *std::move(info);
    return true;
  }

  // -1 once every process in `names` has reported where it listens; else
  // an exit code. `training`: the learner may already be training (the
  // workers' reports: the first ones send groups while a slow one has not
  // reported), so a process that dies meanwhile is restarted as in training.
  int AwaitReady(std::vector<std::string> pending, bool training = false) {
    const auto deadline = Clock::now() + options_.health_timeout;
    while (true) {
      if (TerminationSignal() != 0) return Interrupted();
      if (const int code = CheckChildren(training); code >= 0) return code;
      for (auto it = pending.begin(); it != pending.end();) {
        absl::StatusOr<bool> ready = CollectReady(*it);
        if (!ready.ok()) {
          std::cerr << "kappa run: " << ready.status().message() << "\n";
          return 1;
        }
        it = *ready ? pending.erase(it) : it + 1;
      }
      if (pending.empty()) return -1;
      if (Clock::now() > deadline) {
        std::cerr << "kappa run: not listening after " << options_.health_timeout.count()
                  << " s: " << absl::StrJoin(pending, ", ") << "; see " << options_.run_dir
                  << "/logs/\n";
        return 1;
      }
      std::this_thread::sleep_for(kReadyPollInterval);
    }
  }

  // -1 once every process in `names` is SERVING; else an exit code.
  int AwaitHealth(std::vector<std::string> pending) {
    const auto deadline = Clock::now() + options_.health_timeout;
    while (!pending.empty()) {
      if (TerminationSignal() != 0) return Interrupted();
      if (const int code = CheckChildren(/*training=*/false); code >= 0) return code;
      for (auto it = pending.begin(); it != pending.end();) {
        if (services::CheckHealth(Address(*it), absl::Seconds(1), options_.security).ok()) {
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      if (pending.empty()) break;
      if (Clock::now() > deadline) {
        std::vector<std::string> names;
        for (const std::string& name : pending) {
          names.push_back(absl::StrCat(name, " (", Address(name), ")"));
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

  // Writes <run_dir>/prometheus.yml: every process's /metrics address as it
  // reported it. REQUIRES: every process has reported (AwaitReady).
  void WritePrometheusConfig() {
    std::vector<MetricsEndpoint> endpoints;
    for (const ServiceProcess* service : AllServices()) {
      const std::string& address = ready_[service->spec.name].metrics_address;
      if (!address.empty()) endpoints.push_back({service->job, service->spec.name, address});
    }
    const std::string path = options_.run_dir + "/prometheus.yml";
    if (absl::Status status =
            services::WriteFileAtomically(path, PrometheusScrapeConfig(endpoints));
        !status.ok()) {
      std::cerr << "kappa run: " << status.message() << "\n";
    }
  }

  std::vector<const ServiceProcess*> AllServices() const {
    std::vector<const ServiceProcess*> all = {&plan_.teacher, &plan_.verifier, &plan_.learner};
    for (const ServiceProcess& rank : plan_.learner_ranks) all.push_back(&rank);
    for (const ServiceProcess& worker : plan_.workers) all.push_back(&worker);
    return all;
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
  // line, unless it is in a crash loop (RestartBudget: it died within
  // RestartBudget::kHealthyUptime of its start more than
  // RestartBudget::kMaxQuickRestarts times in a row); the workers reconnect
  // and the learner re-issues a dead worker's leases, so nothing is lost. A
  // learner rank is never restarted here (`kappa run --resume` does that),
  // nor is anything that fails while the run is still starting up.
  //
  // True when `event` was a restartable process and it runs again, on the
  // addresses its first run reported.
  bool Restart(const ExitEvent& event) {
    const auto it = restartable_.find(event.pid);
    if (it == restartable_.end()) return false;
    const std::string name = it->second;
    restartable_.erase(it);
    display_.Finish();
    const auto healthy = RestartBudget::kHealthyUptime.count();
    const ServiceProcess& service = *services_[name];
    if (!restart_budget_.TryRestart(name, started_[name], Clock::now())) {
      std::cerr << "kappa run: " << name << " died within " << healthy << " s of its start "
                << RestartBudget::kMaxQuickRestarts + 1
                << " times in a row (a crash loop); giving up; log " << service.spec.log_file
                << "\n";
      return false;
    }
    std::cerr << "kappa run: " << name << " " << event.status.ToString()
              << " during training; restarting it (restart " << restart_budget_.total(name)
              << "; a crash loop, " << RestartBudget::kMaxQuickRestarts + 1
              << " deaths in a row within " << healthy << " s of a start, ends the run; log "
              << service.spec.log_file << ")\n"
              << std::flush;
    const ProcessSpec spec =
        ready_.count(name) > 0 ? PinnedSpec(specs_[name], ready_[name]) : specs_[name];
    if (!Spawn(service, spec)) return false;
    restartable_[pids_[name]] = name;
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
  pid_t learner_pid_ = 0;
  // By process name (ProcessSpec::name): the plan entry, the command line it
  // last ran with, the pid running now and when it started, and what its
  // first run reported.
  std::map<std::string, const ServiceProcess*> services_;
  std::map<std::string, ProcessSpec> specs_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, Clock::time_point> started_;  // when pids_[name] was spawned
  std::map<std::string, services::ReadyInfo> ready_;
  std::map<pid_t, std::string> restartable_;  // running, restartable
  RestartBudget restart_budget_;
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
