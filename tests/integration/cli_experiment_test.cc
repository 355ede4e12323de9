// `kappa experiment` without processes: the ablation file (parsing, errors
// that name file and line, override validation naming the arm, the shipped
// configs/ablation.yaml) and the results (metrics.jsonl summaries, mean ± std
// per arm, "–" for what is missing).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/ablation_spec.h"
#include "cli/experiment_results.h"
#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::WriteFile;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in:\n" << text;
}

class ExperimentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("kappa_experiment");
    ASSERT_FALSE(dir_.empty());
    WriteFile(dir_ + "/base.yaml", "name: base\ntrainer: {steps: 50}\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    WriteFile(path, text);
    return path;
  }
  // The error of parsing `text` as abl.yaml ("" when it parses).
  std::string ParseError(const std::string& text) {
    absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", text));
    return spec.ok() ? "" : std::string(spec.status().message());
  }

  std::string dir_;
};

// --- the ablation file

constexpr const char* kGoodAblation = R"(base: base.yaml
seeds: [3, 1]
overrides: [trainer.steps=20, trainer.eval_every=10]
quick:
  seeds: [7]
  overrides: [trainer.steps=5]
arms:
  - name: plain
    description: "nothing changed"
  - name: listy
    overrides:
      - trainer.balance=[m3_norm,m3_project]
      - "trainer.lambda=0.5"
)";

TEST_F(ExperimentTest, ParsesAGoodFile) {
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", kGoodAblation));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(fs::path(spec->base_config), fs::path(dir_) / "base.yaml")
      << "base is relative to the ablation file's directory";
  EXPECT_EQ(spec->seeds, (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(spec->overrides, (std::vector<std::string>{"trainer.steps=20", "trainer.eval_every=10"}));
  ASSERT_EQ(spec->arms.size(), 2u);
  EXPECT_EQ(spec->arms[0].name, "plain");
  EXPECT_EQ(spec->arms[0].description, "nothing changed");
  EXPECT_TRUE(spec->arms[0].overrides.empty());
  EXPECT_EQ(spec->arms[0].line, 8);
  EXPECT_EQ(spec->arms[1].overrides,
            (std::vector<std::string>{"trainer.balance=[m3_norm,m3_project]", "trainer.lambda=0.5"}));

  const std::vector<PlannedRun> runs = PlanRuns(*spec, "/out/runs");
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].name, "plain-s3");
  EXPECT_EQ(runs[1].name, "plain-s1");
  EXPECT_EQ(runs[3].name, "listy-s1");
  EXPECT_EQ(runs[3].overrides,
            (std::vector<std::string>{"name=listy-s1", "runs_dir='/out/runs'", "trainer.seed=1",
                                      "trainer.steps=20", "trainer.eval_every=10",
                                      "trainer.balance=[m3_norm,m3_project]",
                                      "trainer.lambda=0.5"}));

  absl::StatusOr<std::vector<services::Config>> configs = ResolveRunConfigs(*spec, runs);
  ASSERT_TRUE(configs.ok()) << configs.status();
  const services::Config& listy = (*configs)[3];
  EXPECT_EQ(listy.name, "listy-s1");
  EXPECT_EQ(listy.runs_dir, "/out/runs");
  EXPECT_EQ(listy.seed, 1u);
  EXPECT_EQ(listy.trainer.steps, 20);
  EXPECT_EQ(listy.trainer.balance, (std::vector<std::string>{"m3_norm", "m3_project"}));
  EXPECT_DOUBLE_EQ(listy.trainer.lambda, 0.5);
  EXPECT_EQ((*configs)[0].trainer.balance, (std::vector<std::string>{"naive"}));
}

TEST_F(ExperimentTest, QuickReplacesSeedsAndAppendsOverrides) {
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", kGoodAblation));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(ApplyQuick(&*spec).ok());
  EXPECT_EQ(spec->seeds, (std::vector<uint64_t>{7}));
  absl::StatusOr<std::vector<services::Config>> configs =
      ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_TRUE(configs.ok()) << configs.status();
  ASSERT_EQ(configs->size(), 2u);
  EXPECT_EQ((*configs)[0].trainer.steps, 5) << "the quick override comes after the common one";
  EXPECT_EQ((*configs)[0].trainer.eval_every, 10);

  absl::StatusOr<AblationSpec> no_quick =
      LoadAblationSpec(Write("nq.yaml", "base: base.yaml\nseeds: [1]\narms: [{name: a}]\n"));
  ASSERT_TRUE(no_quick.ok()) << no_quick.status();
  absl::Status status = ApplyQuick(&*no_quick);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(Contains(std::string(status.message()), "nq.yaml"));
}

TEST_F(ExperimentTest, ArmWithoutNameNamesFileAndLine) {
  const std::string error = ParseError(R"(base: base.yaml
seeds: [1]
arms:
  - name: a
  - description: "forgot the name"
    overrides: [trainer.lambda=2]
)");
  EXPECT_TRUE(Contains(error, "abl.yaml:5: arm #2"));
  EXPECT_TRUE(Contains(error, "has no name"));
}

TEST_F(ExperimentTest, StructuralErrorsNameFileAndLine) {
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\nmodes: 3\narms: [{name: a}]\n"), "abl.yaml:3: unknown key 'modes'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1, two]\narms: [{name: a}]\n"), "abl.yaml:2: seed 'two'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1, -4]\narms: [{name: a}]\n"), "abl.yaml:2: seed '-4'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms:\n  - name: a\n  - name: a\n"), "abl.yaml:5: arm 'a' is defined twice"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms:\n  - name: a\n    colour: red\n"), "abl.yaml:5: unknown arm key 'colour'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms:\n  - name: a/b\n"), "abl.yaml:4: arm name 'a/b'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms:\n  - name: a\n    overrides: [lambda]\n"), "abl.yaml:5: overrides: expected key=value"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\noverrides: [trainer.seed=4]\narms: [{name: a}]\n"), "abl.yaml:3: overrides: 'trainer.seed' is set by kappa experiment"));
  EXPECT_TRUE(Contains(ParseError("seeds: [1]\narms: [{name: a}]\n"), "abl.yaml:1: missing 'base'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms: [{name: a}\n"), "abl.yaml:"));
  EXPECT_EQ(ParseError("base: base.yaml\nseeds: [1]\narms: [{name: a}]\n"), "");
}

TEST_F(ExperimentTest, UnknownOverrideKeyNamesTheArm) {
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", R"(base: base.yaml
seeds: [1, 2]
arms:
  - name: fine
    overrides: [trainer.lambda=2]
  - name: typo
    overrides: [trainer.lambdaa=2]
)"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<services::Config>> configs =
      ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_FALSE(configs.ok());
  const std::string error(configs.status().message());
  EXPECT_TRUE(Contains(error, "abl.yaml:6: arm 'typo'"));
  EXPECT_TRUE(Contains(error, "trainer.lambdaa"));

  // A wrong type too, and a mistake in the common overrides is not blamed on
  // an arm.
  spec->arms[1].overrides = {"trainer.steps=many"};
  configs = ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_FALSE(configs.ok());
  EXPECT_TRUE(Contains(std::string(configs.status().message()), "arm 'typo'"));
  EXPECT_TRUE(Contains(std::string(configs.status().message()), "many"));
  spec->arms[1].overrides.clear();
  ASSERT_TRUE(AppendCommonOverrides(&*spec, {"trainer.stepz=3"}).ok());
  configs = ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_FALSE(configs.ok());
  EXPECT_TRUE(Contains(std::string(configs.status().message()), "common overrides"));
  EXPECT_FALSE(Contains(std::string(configs.status().message()), "arm '"));

  EXPECT_FALSE(AppendCommonOverrides(&*spec, {"runs_dir=/x"}).ok());
}

TEST_F(ExperimentTest, ShippedAblationFileIsValid) {
  const std::string path = std::string(KAPPA_SOURCE_DIR) + "/configs/ablation.yaml";
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(fs::path(spec->base_config).filename(), "demo.yaml");
  EXPECT_EQ(spec->seeds, (std::vector<uint64_t>{1, 2, 3}));
  std::vector<std::string> names;
  for (const AblationArm& arm : spec->arms) {
    names.push_back(arm.name);
    EXPECT_FALSE(arm.description.empty()) << arm.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"grpo_only", "opd_only", "naive", "naive_high_kappa",
                                             "m3_norm", "m3_mask", "m3_project", "m3_adapt",
                                             "m3_norm_project", "rstg"}));

  absl::StatusOr<std::vector<services::Config>> configs =
      ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_TRUE(configs.ok()) << configs.status();
  ASSERT_EQ(configs->size(), 30u);
  auto config_of = [&](const std::string& arm) -> const services::Config& {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == arm) return (*configs)[i * 3];
    }
    return (*configs)[0];
  };
  EXPECT_EQ(config_of("grpo_only").trainer.distill_gate, "none");
  EXPECT_EQ(config_of("grpo_only").trainer.steps, 250);
  EXPECT_EQ(config_of("grpo_only").trainer.eval_every, 125);
  EXPECT_EQ(config_of("opd_only").trainer.reward_weight, 0.0);
  EXPECT_EQ(config_of("naive").trainer.balance, (std::vector<std::string>{"naive"}));
  EXPECT_DOUBLE_EQ(config_of("naive_high_kappa").trainer.lambda, 0.002);
  EXPECT_EQ(config_of("m3_mask").trainer.balance, (std::vector<std::string>{"m3_mask"}));
  EXPECT_EQ(config_of("m3_norm_project").trainer.balance,
            (std::vector<std::string>{"m3_norm", "m3_project"}));
  EXPECT_EQ(config_of("rstg").trainer.distill_gate, "rstg");
  // Every arm shares the base's bootstrap cache.
  for (const services::Config& config : *configs) {
    EXPECT_EQ(config.data_dir, (*configs)[0].data_dir);
  }

  ASSERT_TRUE(ApplyQuick(&*spec).ok());
  configs = ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_TRUE(configs.ok()) << configs.status();
  ASSERT_EQ(configs->size(), 10u);
  EXPECT_EQ((*configs)[0].trainer.steps, 100);
}

// --- results

nlohmann::json Step(int64_t step, double distill) {
  return {{"step", step}, {"reward_mean", 0.1 * step}, {"loss_reward", 0.0},
          {"loss_distill", distill}, {"elapsed_seconds", 0.5 * step}};
}

// Steps 1..8, L_D 8, 7, ..., 1; κ on some steps, null or missing on others;
// alarms at steps 3 (two kinds) and 6; evals at 0, 4 and 8.
std::vector<nlohmann::json> SyntheticRun(double final_accuracy) {
  std::vector<nlohmann::json> records = {{{"step", 0}, {"eval_accuracy", 0.1}}};
  for (int64_t step = 1; step <= 8; ++step) {
    nlohmann::json record = Step(step, 9.0 - static_cast<double>(step));
    if (step % 2 == 0) {
      record["kappa"] = static_cast<double>(step);  // 2, 4, 6, 8
      record["kappa_effective"] = 10.0 * step;
    }
    if (step == 3) record["kappa"] = nullptr;
    record["kdr_negative_fraction"] = step <= 4 ? 0.2 : 0.4;
    if (step != 5) record["kdr_negative_weighted_fraction"] = 0.1 * step;
    if (step == 3) {
      record["alarms"] = {{{"kind", "magnitude_drowning"}, {"step", 3}, {"message", "m"}},
                          {{"kind", "collapse"}, {"step", 3}}};
    }
    if (step == 6) record["alarms"] = {{{"kind", "magnitude_drowning"}, {"step", 6}}};
    if (step == 4) record["eval_accuracy"] = 0.2;
    if (step == 8) record["eval_accuracy"] = final_accuracy;
    records.push_back(record);
  }
  return records;
}

TEST(ExperimentResultsTest, SummarizesOneRun) {
  const RunMetrics m = SummarizeMetrics(SyntheticRun(0.75));
  EXPECT_EQ(m.records, 8);
  EXPECT_EQ(m.last_step, 8);
  ASSERT_TRUE(m.final_accuracy);
  EXPECT_DOUBLE_EQ(*m.final_accuracy, 0.75);
  EXPECT_EQ(m.final_accuracy_step, 8);
  // Quarters of 8 steps: steps 1-2 (L_D 8, 7) and 7-8 (L_D 2, 1).
  ASSERT_TRUE(m.distill_first_quarter && m.distill_last_quarter && m.distill_trend);
  EXPECT_DOUBLE_EQ(*m.distill_first_quarter, 7.5);
  EXPECT_DOUBLE_EQ(*m.distill_last_quarter, 1.5);
  EXPECT_DOUBLE_EQ(*m.distill_trend, -6.0);
  ASSERT_TRUE(m.reward_last_quarter);
  EXPECT_NEAR(*m.reward_last_quarter, 0.75, 1e-12);
  // κ over 2, 4, 6, 8 only: the null at step 3 and the missing odd steps are
  // skipped, not read as 0.
  ASSERT_TRUE(m.kappa_median);
  EXPECT_DOUBLE_EQ(*m.kappa_median, 5.0);
  ASSERT_TRUE(m.kappa_effective_median);
  EXPECT_DOUBLE_EQ(*m.kappa_effective_median, 50.0);
  ASSERT_TRUE(m.kdr_negative_fraction_median);
  EXPECT_DOUBLE_EQ(*m.kdr_negative_fraction_median, 0.3);
  ASSERT_TRUE(m.kdr_negative_weighted_fraction_median);
  EXPECT_DOUBLE_EQ(*m.kdr_negative_weighted_fraction_median, 0.4);  // of .1 .2 .3 .4 .6 .7 .8
  EXPECT_EQ(m.alarms.at("magnitude_drowning").count, 2);
  EXPECT_EQ(m.alarms.at("magnitude_drowning").first_step, 3);
  EXPECT_EQ(m.alarms.at("collapse").count, 1);
  EXPECT_EQ(m.alarms.at("collapse").first_step, 3);
  EXPECT_EQ(m.alarms.at("directional_conflict").count, 0);
  EXPECT_FALSE(m.alarms.at("directional_conflict").first_step);
  ASSERT_TRUE(m.train_seconds);
  EXPECT_DOUBLE_EQ(*m.train_seconds, 4.0);
}

TEST(ExperimentResultsTest, MissingFieldsStayUnset) {
  const RunMetrics m = SummarizeMetrics({{{"step", 0}}, {{"step", 1}, {"reward_mean", 0.5}}});
  EXPECT_EQ(m.records, 1);
  EXPECT_FALSE(m.final_accuracy);
  EXPECT_FALSE(m.distill_trend);
  EXPECT_FALSE(m.kappa_median);
  EXPECT_FALSE(m.kdr_negative_fraction_median);
  EXPECT_FALSE(m.train_seconds);
}

TEST(ExperimentResultsTest, StepsThatDistilledNothingHaveNoDistillLoss) {
  // GRPO only: every step logs loss_distill 0 over 0 positions.
  std::vector<nlohmann::json> grpo;
  for (int64_t step = 1; step <= 8; ++step) {
    nlohmann::json record = Step(step, 0.0);
    record["distill_positions"] = 0;
    grpo.push_back(record);
  }
  EXPECT_FALSE(SummarizeMetrics(grpo).distill_trend) << "no L_D, not an L_D of 0";
  // RSTG: only some steps distil; the quarters are over those.
  std::vector<nlohmann::json> rstg = grpo;
  rstg[1]["loss_distill"] = 4.0;
  rstg[1]["distill_positions"] = 12;
  rstg[6]["loss_distill"] = 1.0;
  rstg[6]["distill_positions"] = 3;
  const RunMetrics m = SummarizeMetrics(rstg);
  ASSERT_TRUE(m.distill_trend);
  EXPECT_DOUBLE_EQ(*m.distill_first_quarter, 4.0);
  EXPECT_DOUBLE_EQ(*m.distill_last_quarter, 1.0);
}

TEST(ExperimentResultsTest, ResumedStepsCountOnce) {
  std::vector<nlohmann::json> records = SyntheticRun(0.5);
  // A resume from step 6 repeats steps 7 and 8 with new numbers.
  records.push_back(Step(7, 20.0));
  nlohmann::json last = Step(8, 30.0);
  last["eval_accuracy"] = 0.9;
  records.push_back(last);
  const RunMetrics m = SummarizeMetrics(records);
  EXPECT_EQ(m.records, 8);
  EXPECT_DOUBLE_EQ(*m.final_accuracy, 0.9);
  EXPECT_DOUBLE_EQ(*m.distill_last_quarter, 25.0);
}

TEST(ExperimentResultsTest, AggregateIsMeanAndSampleStd) {
  std::optional<MeanStd> a = Aggregate({1.0, std::nullopt, 2.0, 3.0});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->n, 3);
  EXPECT_DOUBLE_EQ(a->mean, 2.0);
  EXPECT_DOUBLE_EQ(a->std, 1.0);
  a = Aggregate({4.0});
  ASSERT_TRUE(a);
  EXPECT_DOUBLE_EQ(a->std, 0.0);
  EXPECT_FALSE(Aggregate({std::nullopt}));
  EXPECT_FALSE(Median({}));
  EXPECT_DOUBLE_EQ(*Median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(*Median({4.0, 1.0, 2.0, 3.0}), 2.5);
}

// Writes `records` as a metrics.jsonl and reads it back the way the
// experiment does.
RunMetrics ThroughFile(const std::string& path, const std::vector<nlohmann::json>& records,
                       const std::string& trailer = "") {
  std::string text;
  for (const nlohmann::json& record : records) text += record.dump() + "\n";
  WriteFile(path, text + trailer);
  absl::StatusOr<RunMetrics> metrics = ReadRunMetrics(path);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? *metrics : RunMetrics{};
}

// Splits "| a | b |" into its cells.
std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> cells;
  size_t start = row.find('|');
  while (start != std::string::npos) {
    size_t end = row.find(" |", start + 1);
    if (end == std::string::npos) break;
    std::string cell = row.substr(start + 1, end - start - 1);
    cell.erase(0, cell.find_first_not_of(' '));
    cells.push_back(cell);
    start = end + 1;
  }
  return cells;
}

std::string RowOf(const std::string& markdown, const std::string& arm) {
  const size_t at = markdown.find("| " + arm + " |");
  if (at == std::string::npos) return "";
  return markdown.substr(at, markdown.find('\n', at) - at);
}

TEST_F(ExperimentTest, ReportsMeanAndStdPerArmFromMetricsFiles) {
  std::vector<RunResult> runs;
  const double accuracies[] = {0.5, 0.6, 0.7};
  for (int seed = 1; seed <= 3; ++seed) {
    RunResult run;
    run.arm = "mixed";
    run.seed = seed;
    run.name = "mixed-s" + std::to_string(seed);
    run.status = "ok";
    run.wall_seconds = 10.0 * seed;
    std::vector<nlohmann::json> records = SyntheticRun(accuracies[seed - 1]);
    if (seed == 3) records[7]["alarms"] = {{{"kind", "directional_conflict"}, {"step", 7}}};
    run.metrics = ThroughFile(dir_ + "/" + run.name + ".jsonl", records);
    runs.push_back(run);
  }
  // An arm whose metrics have no κ, no K_DR and no evaluation, and a run that
  // failed before writing any metrics.
  RunResult bare;
  bare.arm = "bare";
  bare.seed = 1;
  bare.name = "bare-s1";
  bare.status = "ok";
  bare.wall_seconds = 5.0;
  bare.metrics = ThroughFile(dir_ + "/bare.jsonl",
                             {{{"step", 1}, {"loss_distill", 2.0}}, {{"step", 2}, {"loss_distill", 3.0}}},
                             "{\"step\": 3, \"loss_di");  // killed mid-line
  EXPECT_EQ(bare.metrics->skipped_lines, 1);
  runs.push_back(bare);
  RunResult broken;
  broken.arm = "bare";
  broken.seed = 2;
  broken.name = "bare-s2";
  broken.status = "failed";
  broken.error = "kappa run exited with status 1, see \"log\"";
  broken.wall_seconds = 1.0;
  runs.push_back(broken);
  EXPECT_EQ(ReadRunMetrics(dir_ + "/none.jsonl").status().code(), absl::StatusCode::kNotFound);

  const std::vector<AblationArm> arms = {{"mixed", "both | signals", {"trainer.lambda=1"}, 1},
                                         {"bare", "", {}, 2}};
  const std::string md = ResultsMarkdown("t", "context line", arms, runs);
  const std::vector<std::string> mixed = Cells(RowOf(md, "mixed"));
  ASSERT_EQ(mixed.size(), 14u) << md;
  EXPECT_EQ(mixed[1], "3/3");
  EXPECT_EQ(mixed[2], "0.600 ± 0.100");       // final accuracy
  EXPECT_EQ(mixed[3], "7.5 ± 0");           // L_D first quarter
  EXPECT_EQ(mixed[4], "1.5 ± 0");           // L_D last quarter
  EXPECT_EQ(mixed[5], "-6 ± 0");            // trend (signed; no sign on the std)
  EXPECT_EQ(mixed[6], "5 ± 0");               // κ median
  EXPECT_EQ(mixed[7], "50 ± 0");              // κ_eff median
  EXPECT_EQ(mixed[8], "0.300 ± 0.000");
  EXPECT_EQ(mixed[10], "2 ± 0 (first @3)");   // magnitude_drowning
  EXPECT_EQ(mixed[11], "0.333 ± 0.577 (first @7)");  // directional_conflict: 0, 0, 1
  EXPECT_EQ(mixed[12], "1 ± 0 (first @3)");   // collapse
  EXPECT_EQ(mixed[13], "20 ± 10");            // wall seconds

  const std::vector<std::string> bare_row = Cells(RowOf(md, "bare"));
  ASSERT_EQ(bare_row.size(), 14u) << md;
  EXPECT_EQ(bare_row[1], "1/2");
  EXPECT_EQ(bare_row[2], "–") << "no evaluation: a dash, not 0";
  EXPECT_EQ(bare_row[5], "+1 (n=1)");
  EXPECT_EQ(bare_row[6], "–");
  EXPECT_EQ(bare_row[7], "–");
  EXPECT_EQ(bare_row[8], "–");
  EXPECT_EQ(bare_row[10], "0 (n=1)");
  EXPECT_TRUE(Contains(md, "context line"));
  EXPECT_TRUE(Contains(md, "- `mixed`: both | signals (`trainer.lambda=1`)"));
  EXPECT_TRUE(Contains(md, "`bare-s2`: failed: kappa run exited with status 1"));

  const std::string csv = ResultsCsv(runs);
  std::vector<std::string> lines;
  for (size_t start = 0, nl; (nl = csv.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(csv.substr(start, nl - start));
  }
  ASSERT_EQ(lines.size(), 6u) << csv;
  EXPECT_TRUE(Contains(lines[0], "arm,seed,name,status,wall_seconds"));
  EXPECT_TRUE(Contains(lines[0], "kappa_median"));
  EXPECT_TRUE(Contains(lines[0], "alarms_directional_conflict,first_step_directional_conflict"));
  EXPECT_TRUE(Contains(lines[1], "mixed,1,mixed-s1,ok,10,4,8,0.5,8,7.5,1.5,-6,"));
  EXPECT_TRUE(Contains(lines[3], ",1,7,"));  // seed 3: one directional_conflict at step 7
  // bare-s1: no eval, no κ: empty cells, not 0.
  EXPECT_TRUE(Contains(lines[4], "bare,1,bare-s1,ok,5,,2,,,2,3,1,,,,,,0,,0,,0,,0,"));
  EXPECT_TRUE(Contains(lines[5], "bare,2,bare-s2,failed,1,"));
  EXPECT_TRUE(Contains(lines[5], "\"kappa run exited with status 1, see \"\"log\"\"\""));
}

}  // namespace
}  // namespace kappa::cli
