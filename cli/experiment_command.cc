#include "cli/experiment_command.h"

#include <torch/torch.h>

#include <ctime>
#include <filesystem>
#include <iostream>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/ablation_spec.h"
#include "cli/args.h"
#include "cli/child_run.h"
#include "cli/experiment_results.h"
#include "cli/experiment_trend.h"
#include "cli/progress.h"
#include "cli/report_experiment.h"
#include "cli/run_dir.h"
#include "cli/run_session.h"
#include "cli/termination_signal.h"
#include "learner/step_config.h"
#include "services/atomic_file.h"
#include "services/config.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: kappa experiment ABLATION.yaml [key=value ...] [--quick] [--resume] [--out DIR]\n";

// A fresh DIR for this experiment: a previous one (non-empty) is moved aside
// to DIR.<timestamp>, so results never mix runs of two experiments and
// `kappa run` never has to move a same-named run directory itself. With
// `resume` the previous DIR stays: its finished runs are kept (RunAll).
absl::Status PrepareOutDir(const fs::path& out, bool resume) {
  if (!resume) {
    absl::StatusOr<std::string> aside = MoveAsideIfNonEmpty(out.string(), "experiment");
    if (!aside.ok()) return aside.status();
    if (!aside->empty()) {
      std::cerr << "kappa experiment: previous " << out.string() << " moved to " << *aside << "\n";
    }
  }
  std::error_code ec;
  fs::create_directories(out / "logs", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", (out / "logs").string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

std::string ShellWord(const std::string& word) {
  if (!word.empty() && word.find_first_of(" \t\n'\"\\$`*?[]{}();&|<>!#~") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::string CommandLineText(const std::vector<std::string>& argv) {
  std::vector<std::string> words;
  for (const std::string& word : argv) words.push_back(ShellWord(word));
  return absl::StrJoin(words, " ");
}

std::string Context(const AblationSpec& spec, bool quick, size_t runs) {
  return absl::StrCat("Base config `", spec.base_config, "`", quick ? " (--quick)" : "", "; seeds ",
                      absl::StrJoin(spec.seeds, ", "), "; ", runs, " runs. Common overrides: `",
                      spec.overrides.empty() ? "(none)" : absl::StrJoin(spec.overrides, " "),
                      "`. Baseline arm: ",
                      spec.baseline.empty() ? "none" : absl::StrCat("`", spec.baseline, "`"), ".");
}

// "final acc 0.312 (step 300), L_D trend -0.1234, κ median 3.2"
std::string OneLineSummary(const RunMetrics& m) {
  std::vector<std::string> parts;
  if (m.final_accuracy) {
    parts.push_back(absl::StrFormat("final acc %.3f (step %d)", *m.final_accuracy,
                                    m.final_accuracy_step.value_or(0)));
  }
  if (m.distill_trend) parts.push_back(absl::StrFormat("L_D trend %+.4f", *m.distill_trend));
  if (m.kappa_median) parts.push_back(absl::StrFormat("κ median %.3g", *m.kappa_median));
  int64_t alarms = 0;
  for (const auto& [kind, stats] : m.alarms) alarms += stats.count;
  if (alarms > 0) parts.push_back(absl::StrCat(alarms, " alarm", alarms == 1 ? "" : "s"));
  return parts.empty() ? "no metrics" : absl::StrJoin(parts, ", ");
}

// What the ablation file and the command line resolve to, checked in full
// before anything is written.
struct ExperimentPlan {
  AblationSpec spec;
  bool quick = false;
  bool resume = false;  // --resume: keep DIR and the runs finished in it
  fs::path out;         // DIR
  std::vector<PlannedRun> runs;
  std::vector<services::Config> configs;  // one per run
  std::string title;                      // of results.md and report.html
  std::string context;
};

// Values too (trainer.distill_gate=rstgg), before the first run starts.
absl::Status ValidateRunValues(const ExperimentPlan& plan) {
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    if (absl::Status status = learner::ValidateStepConfig(plan.configs[i]); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("arm '", plan.runs[i].arm, "': ", status.message()));
    }
  }
  return absl::OkStatus();
}

// Everything that can be wrong in the ablation file fails here, before the
// first run starts.
absl::StatusOr<ExperimentPlan> LoadPlan(const CommandLine& line) {
  absl::StatusOr<AblationSpec> loaded = LoadAblationSpec(line.config_path);
  if (!loaded.ok()) return loaded.status();
  ExperimentPlan plan;
  plan.spec = *std::move(loaded);
  AblationSpec& spec = plan.spec;
  plan.quick = line.Has("--quick");
  plan.resume = line.Has("--resume");
  if (plan.quick) {
    if (absl::Status status = ApplyQuick(&spec); !status.ok()) return status;
  }
  if (absl::Status status = AppendCommonOverrides(&spec, line.overrides); !status.ok()) {
    return status;
  }
  absl::StatusOr<services::Config> base = services::LoadConfig(spec.base_config, spec.overrides);
  if (!base.ok()) {
    return absl::Status(base.status().code(),
                        absl::StrCat(spec.file, ": base config: ", base.status().message()));
  }
  std::error_code ec;
  plan.out = fs::absolute(
      line.Get("--out", (fs::path(base->runs_dir) / fs::path(spec.file).stem()).string()), ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--out: ", ec.message()));
  plan.runs = PlanRuns(spec, (plan.out / "runs").string());
  absl::StatusOr<std::vector<services::Config>> configs = ResolveRunConfigs(spec, plan.runs);
  if (!configs.ok()) return configs.status();
  plan.configs = *std::move(configs);
  if (absl::Status status = ValidateRunValues(plan); !status.ok()) return status;
  plan.title = absl::StrCat("Ablation results: ", spec.file);
  plan.context = Context(spec, plan.quick, plan.runs.size());
  return plan;
}

// A fresh DIR, and DIR/commands.txt: each run's exact command, to repeat one
// by hand. Returns those commands (argv[0]: this binary).
absl::StatusOr<std::vector<std::vector<std::string>>> PrepareOutput(const ExperimentPlan& plan) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
  if (absl::Status status = PrepareOutDir(plan.out, plan.resume); !status.ok()) return status;
  std::vector<std::vector<std::string>> argvs;
  std::string commands;
  for (const PlannedRun& run : plan.runs) {
    std::vector<std::string> argv = {self.string(), "run", plan.spec.base_config};
    argv.insert(argv.end(), run.overrides.begin(), run.overrides.end());
    argv.push_back("--no-progress");
    absl::StrAppend(&commands, CommandLineText(argv), "\n");
    argvs.push_back(std::move(argv));
  }
  if (absl::Status status =
          services::WriteFileAtomically((plan.out / "commands.txt").string(), commands);
      !status.ok()) {
    return status;
  }
  return argvs;
}

// One "not run" result per planned run.
std::vector<RunResult> InitialResults(const std::vector<PlannedRun>& runs) {
  std::vector<RunResult> results;
  for (const PlannedRun& run : runs) {
    RunResult result;
    result.arm = run.arm;
    result.seed = run.seed;
    result.name = run.name;
    results.push_back(std::move(result));
  }
  return results;
}

// The trend the file names, fitted over `results`; nullopt when it names none.
// REQUIRES: `metrics` is ComparedMetrics(results).
std::optional<TrendResult> FitPlannedTrend(const ExperimentPlan& plan,
                                           const std::vector<RunResult>& results,
                                           const std::vector<ComparedMetric>& metrics) {
  if (!plan.spec.trend) return std::nullopt;
  return FitTrend(*plan.spec.trend, results, metrics);
}

// results.md: the arms, the differences against the baseline and `trend`.
std::string ExperimentMarkdown(const ExperimentPlan& plan, const std::vector<RunResult>& results,
                               const std::optional<TrendResult>& trend) {
  std::string md = ResultsMarkdown(plan.title, plan.context, plan.spec.arms, results,
                                   plan.spec.baseline, plan.spec.effects);
  if (trend) absl::StrAppend(&md, TrendMarkdown(*trend));
  return md;
}

// results.csv, summary.csv, differences.csv, results.md (trend.csv) and report.html as
// they stand; a failure to write one is reported, not fatal.
void WriteResults(const ExperimentPlan& plan, const std::vector<RunResult>& results) {
  const fs::path& out = plan.out;
  const std::vector<AblationArm>& arms = plan.spec.arms;
  const std::vector<ComparedMetric> metrics = ComparedMetrics(results);
  const std::optional<TrendResult> trend = FitPlannedTrend(plan, results, metrics);
  std::vector<std::pair<const char*, std::string>> files = {
      {"results.csv", ResultsCsv(results)},
      {"summary.csv", SummaryCsv(SummarizeArms(arms, results, metrics))},
      {"differences.csv", DifferencesCsv(PairedDifferences(arms, results, plan.spec.baseline,
                                                           metrics, plan.spec.effects))},
      {"results.md", ExperimentMarkdown(plan, results, trend)},
  };
  if (trend) files.push_back({"trend.csv", TrendCsv(*trend)});
  for (const auto& [name, text] : files) {
    if (absl::Status status = services::WriteFileAtomically((out / name).string(), text);
        !status.ok()) {
      std::cerr << "kappa experiment: " << status.message() << "\n";
    }
  }
  if (absl::Status status = WriteExperimentReport(out.string(), plan.title, plan.context, arms,
                                                  results, plan.spec.baseline);
      !status.ok()) {
    std::cerr << "kappa experiment: report.html: " << status.message() << "\n";
  }
}

struct RunTally {
  bool interrupted = false;
  int failed = 0;
};

// Runs `plan.runs[i]` as a child `kappa run` and records its outcome and
// metrics in `result`, with a line on stderr before and after.
ChildRunOutcome RunOne(const ExperimentPlan& plan, size_t i, const std::vector<std::string>& argv,
                       double elapsed, RunResult* result) {
  const PlannedRun& run = plan.runs[i];
  const size_t total = plan.runs.size();
  // Runs are alike in length, so the mean so far is a fair estimate.
  const std::string eta =
      i == 0 ? "" : absl::StrCat(", eta ", FormatDuration(elapsed / i * (total - i)));
  std::cerr << absl::StrFormat("[experiment %d/%d] arm %s, seed %d (%s) | elapsed %s%s\n", i + 1,
                               total, run.arm, run.seed, run.name, FormatDuration(elapsed), eta)
            << std::flush;

  ChildRunOptions options;
  options.argv = argv;
  options.log_file = (plan.out / "logs" / (run.name + ".log")).string();
  options.metrics_path = (plan.out / "runs" / run.name / "metrics.jsonl").string();
  options.label = absl::StrCat(i + 1, "/", total, " ", run.arm, " s", run.seed);
  options.total_steps = plan.configs[i].trainer.steps;
  const ChildRunOutcome outcome = RunChild(options);

  result->wall_seconds = outcome.wall_seconds;
  result->status = outcome.success ? "ok" : outcome.interrupted ? "interrupted" : "failed";
  if (!outcome.success) {
    result->error = absl::StrCat(outcome.error, "; log: ", options.log_file);
  }
  // Partial metrics of a failed run are still worth reporting.
  if (absl::StatusOr<RunMetrics> metrics = ReadRunMetrics(options.metrics_path); metrics.ok()) {
    result->metrics = *std::move(metrics);
  }
  const std::string summary =
      result->metrics ? OneLineSummary(*result->metrics) : std::string("no metrics");
  if (outcome.success) {
    std::cerr << absl::StrFormat("[experiment %d/%d] %s done in %s: %s\n", i + 1, total, run.name,
                                 FormatDuration(outcome.wall_seconds), summary);
  } else if (outcome.interrupted) {
    std::cerr << "kappa experiment: " << outcome.error << "; stopped " << run.name << "\n";
  } else {
    std::cerr << absl::StrFormat(
                     "[experiment %d/%d] %s FAILED after %s (%s); %s; last lines of %s:\n", i + 1,
                     total, run.name, FormatDuration(outcome.wall_seconds), outcome.error, summary,
                     options.log_file)
              << LogTail(options.log_file, 15) << "continuing with the next run\n";
  }
  std::cerr << std::flush;
  return outcome;
}

// With --resume: the metrics of the run `plan.runs[i]` left by an earlier
// attempt in the same DIR, when it reached the run's last step; nothing
// otherwise (no run, an unreadable one, or one that stopped short).
std::optional<RunMetrics> FinishedEarlier(const ExperimentPlan& plan, size_t i) {
  if (!plan.resume) return std::nullopt;
  absl::StatusOr<RunMetrics> metrics =
      ReadRunMetrics((plan.out / "runs" / plan.runs[i].name / "metrics.jsonl").string());
  if (!metrics.ok() || metrics->last_step != plan.configs[i].trainer.steps) return std::nullopt;
  return *std::move(metrics);
}

// Records a run FinishedEarlier found as done, with a line on stderr.
void KeepEarlierRun(const ExperimentPlan& plan, size_t i, RunMetrics metrics, RunResult* result) {
  result->status = "ok";
  result->wall_seconds = metrics.train_seconds.value_or(0.0);
  std::cerr << absl::StrFormat("[experiment %d/%d] %s finished in an earlier attempt, kept: %s\n",
                               i + 1, plan.runs.size(), plan.runs[i].name, OneLineSummary(metrics))
            << std::flush;
  result->metrics = std::move(metrics);
}

// Every run in turn (with --resume, those not finished earlier), until one
// is interrupted or a termination signal arrives; the results are rewritten
// after each.
RunTally RunAll(const ExperimentPlan& plan, const std::vector<std::vector<std::string>>& argvs,
                Clock::time_point start, std::vector<RunResult>* results) {
  RunTally tally;
  for (size_t i = 0; i < plan.runs.size() && !tally.interrupted; ++i) {
    if (TerminationSignal() != 0) {
      tally.interrupted = true;
      break;
    }
    if (std::optional<RunMetrics> earlier = FinishedEarlier(plan, i)) {
      KeepEarlierRun(plan, i, *std::move(earlier), &(*results)[i]);
      continue;
    }
    const ChildRunOutcome outcome = RunOne(plan, i, argvs[i], SecondsSince(start), &(*results)[i]);
    if (!outcome.success) {
      if (outcome.interrupted) {
        tally.interrupted = true;
      } else {
        ++tally.failed;
      }
    }
    WriteResults(plan, *results);  // after every run, so a crash or kill keeps what was measured
  }
  return tally;
}

// The per-arm table on stdout, the totals on stderr; the exit status.
int Summarize(const ExperimentPlan& plan, const std::vector<RunResult>& results,
              const RunTally& tally, Clock::time_point start) {
  std::cout << ExperimentMarkdown(plan, results,
                                  FitPlannedTrend(plan, results, ComparedMetrics(results)))
            << std::flush;
  std::cerr << absl::StrFormat(
      "kappa experiment: %s in %s; %d failed; results in %s/results.md, results.csv, "
      "summary.csv, differences.csv and report.html, run logs in %s/logs/\n",
      tally.interrupted ? "interrupted" : "finished", FormatDuration(SecondsSince(start)),
      tally.failed, plan.out.string(), plan.out.string());
  if (tally.interrupted) return 130;
  return tally.failed > 0 ? 1 : 0;
}

}  // namespace

int ExperimentCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CommandLine> line = ParseCommandLine(args, {"--out"}, {"--quick", "--resume"});
  if (!line.ok()) {
    std::cerr << "kappa experiment: " << line.status().message() << "\n" << kUsage;
    return 2;
  }
  auto fail = [](const absl::Status& status) {
    std::cerr << "kappa experiment: " << status.message() << "\n";
    return 1;
  };
  absl::StatusOr<ExperimentPlan> plan = LoadPlan(*line);
  if (!plan.ok()) return fail(plan.status());
  absl::StatusOr<std::vector<std::vector<std::string>>> argvs = PrepareOutput(*plan);
  if (!argvs.ok()) return fail(argvs.status());

  std::vector<RunResult> results = InitialResults(plan->runs);
  std::cerr << absl::StrFormat("kappa experiment: %d arms x %d seeds = %d runs of %s into %s\n",
                               plan->spec.arms.size(), plan->spec.seeds.size(), plan->runs.size(),
                               plan->spec.base_config, plan->out.string());
  InstallTerminationHandlers();
  const Clock::time_point start = Clock::now();
  const RunTally tally = RunAll(*plan, *argvs, start, &results);
  WriteResults(*plan, results);
  return Summarize(*plan, results, tally, start);
}

}  // namespace kappa::cli
