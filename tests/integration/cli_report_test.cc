// `kappa report` and the comparison page of `kappa experiment`: the loader on
// awkward metrics.jsonl (gaps, sparse eval, alarms, a malformed line, a
// half-written last line), the SVG writer's geometry, and end to end: the
// binary writes a page that headless Chromium loads and renders.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli/report_atlas.h"
#include "cli/report_data.h"
#include "cli/report_experiment.h"
#include "cli/report_run.h"
#include "cli/report_svg.h"
#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::ReadFile;
using testing::WriteFile;

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

// A NaN or infinity in any attribute value: what a chart must never write.
bool HasNonFiniteAttribute(const std::string& svg) {
  static const std::regex bad("=\"[^\"]*\\b(nan|inf)", std::regex::icase);
  return std::regex_search(svg, bad);
}

constexpr int kBuckets = 8;

// One realistic learner record. κ is measured every other step (kappa_every
// = 2: null on odd steps), eval every 10 steps, alarms at a few steps.
nlohmann::json StepRecord(int step, double offset = 0.0) {
  const double t = step / 60.0;
  nlohmann::json r = {
      {"step", step},
      {"policy_version", step},
      {"reward_mean", std::min(1.0, 0.2 + 0.5 * t + offset + 0.05 * std::sin(step))},
      {"samples", 64},
      {"tokens", 300 + step},
      {"samples_per_second", 40.0 + std::cos(step)},
      {"staleness_mean", 0.5 + 0.25 * (step % 3)},
      {"step_seconds", 0.8 + 0.01 * step},
      {"elapsed_seconds", 1.0 * step},
      {"loss_reward", 0.05 * std::sin(step / 3.0)},
      {"loss_distill", 0.9 - 0.4 * t + offset},
      {"loss_sft", 0.0},
      {"entropy", 1.2 - 0.5 * t},
      {"lambda", 1.0},
      {"distill_scale", 1.0},
      {"distill_positions", step == 7 ? 0 : 500},
      {"grad_norm", 1.0},
      {"lr", 3e-4},
  };
  if (step % 2 == 0) {
    const double kappa = 0.1 * std::exp(4.0 * t);  // 0.1 .. ~5.5: crosses nothing, spans decades
    r["kappa"] = kappa;
    r["kappa_effective"] = kappa;
    r["grad_norm_reward"] = kappa * 0.5;
    r["grad_norm_distill"] = 0.5;
    r["grad_cosine"] = -0.2 + 0.4 * std::sin(step / 5.0);
  } else {
    r["kappa"] = nullptr;
    r["kappa_effective"] = nullptr;
    r["grad_norm_reward"] = nullptr;
    r["grad_norm_distill"] = nullptr;
    r["grad_cosine"] = nullptr;
  }
  r["kdr_positions"] = 500;
  r["kdr_mean"] = 0.01;
  r["kdr_negative_fraction"] = 0.2 + 0.3 * t;
  r["kdr_negative_weighted_fraction"] = 0.25 + 0.4 * t;
  r["kdr_quantiles"] = {-0.1, 0.0, 0.1};
  nlohmann::json positions = nlohmann::json::array();
  for (int b = 0; b < kBuckets; ++b) {
    positions.push_back(0.02 * std::sin(0.3 * step + b) - 0.01 * b * t);
  }
  r["kdr_position_mean"] = positions;
  if (step % 10 == 0) r["eval_accuracy"] = 0.3 + 0.4 * t;
  if (step == 20 || step == 45) {
    r["alarms"] = {{{"kind", "directional_conflict"},
                    {"step", step},
                    {"message", "weighted negative fraction 0.61 > 0.5 for 20 steps"},
                    {"values", {{"fraction", 0.61}}}}};
  }
  if (step == 50) {
    r["alarms"] = {{{"kind", "magnitude_drowning"},
                    {"step", step},
                    {"message", "kappa EMA 12 > 10 while L_D rose"},
                    {"values", {{"kappa_ema", 12.0}}}}};
  }
  r["alarm_active"] = {{"magnitude_drowning", 0}, {"directional_conflict", 0}, {"collapse", 0}};
  return r;
}

std::string MetricsText(int steps, double offset = 0.0) {
  std::string text = nlohmann::json({{"step", 0}, {"policy_version", 0}, {"eval_accuracy", 0.3},
                                     {"elapsed_seconds", 0.0}})
                         .dump() +
                     "\n";
  for (int step = 1; step <= steps; ++step) text += StepRecord(step, offset).dump() + "\n";
  return text;
}

constexpr const char* kConfig =
    "name: synthetic\n"
    "trainer:\n"
    "  steps: 60\n"
    "  distill_loss: reverse_kl\n"
    "alarms:\n"
    "  kappa_threshold: 8\n"
    "  conflict_threshold: 0.55\n";

// --- loader

TEST(ReportData, GapsSparseEvalAlarmsMalformedAndPartialLines) {
  std::string text = MetricsText(12);
  // Line 6 (step 5) replaced by garbage; a half-written record at the end.
  std::vector<std::string> lines;
  for (size_t a = 0, b; (b = text.find('\n', a)) != std::string::npos; a = b + 1) {
    lines.push_back(text.substr(a, b - a));
  }
  lines[5] = "{\"step\": 5, \"reward_mean\": 0.4,,}";
  std::string damaged;
  for (const std::string& line : lines) damaged += line + "\n";
  damaged += "\n";  // a blank line is nothing
  damaged += StepRecord(13).dump().substr(0, 40);  // run still writing

  const RunSeries s = ParseMetricsText(damaged, "runs/x/metrics.jsonl");
  EXPECT_EQ(s.skipped_lines, 1);
  ASSERT_EQ(s.problems.size(), 1u);
  EXPECT_NE(s.problems[0].find("runs/x/metrics.jsonl:6:"), std::string::npos) << s.problems[0];
  EXPECT_TRUE(s.partial_tail);
  // Steps 0..12 without 5.
  EXPECT_EQ(s.steps.size(), 12u);
  EXPECT_EQ(s.steps.front(), 0);
  EXPECT_EQ(s.steps.back(), 12);
  EXPECT_EQ(std::count(s.steps.begin(), s.steps.end(), 5), 0);

  const std::vector<double> kappa = s.Series("kappa");
  ASSERT_EQ(kappa.size(), s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    // Null on odd steps and absent at step 0: gaps, never zeros.
    EXPECT_EQ(std::isfinite(kappa[i]), s.steps[i] > 0 && s.steps[i] % 2 == 0) << s.steps[i];
  }
  const std::vector<double> eval = s.Series("eval_accuracy");
  std::vector<int64_t> eval_steps;
  for (size_t i = 0; i < eval.size(); ++i) {
    if (std::isfinite(eval[i])) eval_steps.push_back(s.steps[i]);
  }
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{0, 10}));
  EXPECT_TRUE(s.Has("tokens_per_second"));
  EXPECT_FALSE(s.Has("no_such_field"));
  EXPECT_EQ(s.Series("no_such_field").size(), s.steps.size());
  EXPECT_TRUE(s.kdr_position_mean[0].empty());  // step 0 measures nothing
  EXPECT_EQ(s.kdr_position_mean.back().size(), static_cast<size_t>(kBuckets));
  EXPECT_TRUE(s.alarms.empty());  // first alarm is at step 20
}

TEST(ReportData, AlarmsAndResumedStepsAndEmptyInput) {
  std::string text = MetricsText(50);
  // A resumed run repeats step 50 with other numbers: the later one wins.
  nlohmann::json again = StepRecord(50);
  again["reward_mean"] = 0.123;
  text += again.dump() + "\n";
  const RunSeries s = ParseMetricsText(text, "m.jsonl");
  EXPECT_EQ(s.steps.size(), 51u);
  EXPECT_DOUBLE_EQ(s.Series("reward_mean").back(), 0.123);
  // 20, 45 and 50: the alarm of step 50 counts once, from its later record.
  ASSERT_EQ(s.alarms.size(), 3u);
  EXPECT_EQ(s.alarms[0].step, 20);
  EXPECT_EQ(s.alarms[0].kind, "directional_conflict");
  EXPECT_EQ(s.alarms[2].kind, "magnitude_drowning");
}

TEST(ReportData, EmptyAndOneLineRunsRenderNoData) {
  for (const std::string& text :
       {std::string(), std::string("{\"step\":0,\"eval_accuracy\":0.25}\n"),
        StepRecord(1).dump() + "\n"}) {
    const RunSeries s = ParseMetricsText(text, "m.jsonl");
    const std::string html = RunReportHtml(s, "t");
    for (const std::string& id : RunChartIds()) {
      EXPECT_EQ(Count(html, "data-chart=\"" + id + "\""), 1u) << id;
    }
    EXPECT_GT(Count(html, "no data"), 0u);
    EXPECT_EQ(Count(html, "data-section=\"conflict_atlas\""), 1u);
    EXPECT_FALSE(HasNonFiniteAttribute(html));
  }
}

TEST(ReportData, ConfigThresholdsAndErrors) {
  RunSeries s;
  ApplyConfigText(kConfig, "c.yaml", &s);
  EXPECT_TRUE(s.thresholds_from_config);
  EXPECT_DOUBLE_EQ(s.kappa_threshold, 8);
  EXPECT_DOUBLE_EQ(s.conflict_threshold, 0.55);

  RunSeries broken;
  ApplyConfigText("alarms:\n  kappa_threshold: [1,\n", "c.yaml", &broken);
  EXPECT_FALSE(broken.thresholds_from_config);
  EXPECT_DOUBLE_EQ(broken.kappa_threshold, 10);  // services::Config's default
  EXPECT_NE(broken.config_problem.find("c.yaml:"), std::string::npos) << broken.config_problem;

  const std::string dir = MakeTempDir("kappa_report_missing");
  absl::StatusOr<RunSeries> missing = LoadRunSeries(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/metrics.jsonl"), std::string::npos);
  fs::remove_all(dir);
}

// student.lora in the config: the κ chart says its gradients are the
// adapters' (docs/algorithms.md §3.4), as a list or as ConfigToYaml's text.
TEST(ReportData, LoraRunsTitleKappaAsTheAdapters) {
  RunSeries plain = ParseMetricsText(MetricsText(3), "m.jsonl");
  ApplyConfigText(kConfig, "c.yaml", &plain);
  EXPECT_EQ(plain.lora_rank, 0);
  EXPECT_EQ(RunReportHtml(plain, "run").find("LoRA"), std::string::npos);

  RunSeries listed = ParseMetricsText(MetricsText(3), "m.jsonl");
  ApplyConfigText("student:\n  lora:\n    rank: 8\n    target_modules: [q_proj, v_proj]\n",
                  "c.yaml", &listed);
  EXPECT_EQ(listed.lora_rank, 8);
  EXPECT_EQ(listed.lora_targets, 2);
  EXPECT_NE(RunReportHtml(listed, "run").find("over the LoRA adapters (r = 8, 2 projections"),
            std::string::npos);

  RunSeries written = ParseMetricsText(MetricsText(3), "m.jsonl");
  ApplyConfigText("student:\n  lora:\n    rank: 4\n    target_modules: q_proj,k_proj,o_proj\n",
                  "c.yaml", &written);
  EXPECT_EQ(written.lora_targets, 3);
}

TEST(ReportData, MovingAverageKeepsGaps) {
  const std::vector<double> y = {1, 2, NAN, 3, 4, 5};
  const std::vector<double> m = MovingAverage(y, 3);
  ASSERT_EQ(m.size(), y.size());
  EXPECT_DOUBLE_EQ(m[0], 1.5);  // fewer values at the ends
  EXPECT_DOUBLE_EQ(m[1], 2);    // 1, 2, 3: the neighbours across the gap
  EXPECT_TRUE(std::isnan(m[2]));
  EXPECT_DOUBLE_EQ(m[5], 4.5);
  EXPECT_EQ(MovingAverage(y, 1).size(), y.size());

  // A long run gets a smoothed line beside each noisy raw one.
  const RunSeries long_run = ParseMetricsText(MetricsText(400), "m.jsonl");
  const std::string html = RunReportHtml(long_run, "t");
  EXPECT_NE(html.find("data-series=\"reward mean (batch), mean of 8\""), std::string::npos);
  EXPECT_FALSE(HasNonFiniteAttribute(html));
}

// --- conflict atlas

// One line of conflict_atlas.jsonl as the learner writes it: "a+b=" answered
// with `response`, the token at `token_index` conflicting.
nlohmann::json AtlasLine(int64_t step, double kdr, const std::string& prompt,
                         const std::string& response, int64_t token_index,
                         const std::string& subset = "") {
  const std::string token = token_index < static_cast<int64_t>(response.size())
                                ? response.substr(token_index, 1)
                                : "<eos>";
  nlohmann::json line = {
      {"step", step},
      {"kdr", kdr},
      {"prompt", prompt},
      {"response", response},
      {"token_index", token_index},
      {"token", token},
      {"student_prob", 0.61},
      {"teacher_prob", 0.02},
      {"teacher_top", {{{"token", "9"}, {"prob", 0.97}}, {{"token", token}, {"prob", 0.02}}}},
      {"advantage", -0.8},
      {"reward", 0.0}};
  if (!subset.empty()) line["subset"] = subset;
  return line;
}

std::string Lines(const std::vector<nlohmann::json>& lines) {
  std::string text;
  for (const nlohmann::json& line : lines) text += line.dump() + "\n";
  return text;
}

std::vector<std::pair<int64_t, double>> StepsAndKdr(const std::vector<AtlasEntry>& entries) {
  std::vector<std::pair<int64_t, double>> out;
  for (const AtlasEntry& e : entries) out.emplace_back(e.step, e.kdr);
  return out;
}

TEST(ReportAtlas, ResumedStepsReplaceEarlierOnesAndMalformedLinesAreCounted) {
  std::string text = Lines({AtlasLine(1, -1.0, "1+1=", "2", 0), AtlasLine(1, -0.5, "1+2=", "3", 0),
                            AtlasLine(2, -3.0, "9+9=", "18", 1), AtlasLine(2, -0.2, "1+3=", "4", 0),
                            AtlasLine(3, -2.0, "5+5=", "10", 0)});
  text += "{\"step\": 4, \"kdr\": -1,,}\n";  // line 6
  // Resumed from the checkpoint of step 1: steps 2 and 3 again.
  text += Lines({AtlasLine(2, -2.5, "9+8=", "17", 1), AtlasLine(2, -0.1, "2+2=", "4", 0)});
  text += "{\"step\": 3}\n[1, 2]\n{\"step\": \"3\", \"kdr\": -1}\n";  // lines 9..11
  text += Lines({AtlasLine(3, -0.3, "5+6=", "11", 1)});
  text += "\n" + AtlasLine(4, -9.0, "x", "y", 0).dump().substr(0, 30);  // still being written

  const ConflictAtlasFile atlas = ParseConflictAtlasText(text, "runs/x/conflict_atlas.jsonl");
  EXPECT_EQ(StepsAndKdr(atlas.entries),
            (std::vector<std::pair<int64_t, double>>{
                {1, -1.0}, {1, -0.5}, {2, -2.5}, {2, -0.1}, {3, -0.3}}));
  EXPECT_EQ(atlas.replaced_entries, 3);
  EXPECT_EQ(atlas.skipped_lines, 4);
  ASSERT_EQ(atlas.problems.size(), 4u);
  EXPECT_NE(atlas.problems[0].find("runs/x/conflict_atlas.jsonl:6: not valid JSON"),
            std::string::npos)
      << atlas.problems[0];
  EXPECT_NE(atlas.problems[1].find(":9: \"kdr\""), std::string::npos) << atlas.problems[1];
  EXPECT_NE(atlas.problems[2].find(":10: not a JSON object"), std::string::npos)
      << atlas.problems[2];
  EXPECT_NE(atlas.problems[3].find(":11: \"step\" is not an integer"), std::string::npos)
      << atlas.problems[3];
  EXPECT_TRUE(atlas.partial_tail);

  // The most negative over the whole run, most negative first.
  EXPECT_EQ(StepsAndKdr(MostNegativeAtlasEntries(atlas.entries, 3)),
            (std::vector<std::pair<int64_t, double>>{{2, -2.5}, {1, -1.0}, {1, -0.5}}));
  EXPECT_EQ(MostNegativeAtlasEntries(atlas.entries, 100).size(), 5u);
}

TEST(ReportAtlas, ResumeThatRepeatsTheLastStepItself) {
  // Crashed after writing step 5; resumed from step 4's checkpoint: step 5
  // follows step 5. Its lines restart at the most negative K_DR.
  const ConflictAtlasFile atlas = ParseConflictAtlasText(
      Lines({AtlasLine(4, -1.0, "p", "1", 0), AtlasLine(5, -2.0, "p", "1", 0),
             AtlasLine(5, -0.5, "p", "1", 0), AtlasLine(5, -1.5, "q", "2", 0),
             AtlasLine(5, -1.5, "r", "3", 0), AtlasLine(6, -0.7, "p", "1", 0)}),
      "a.jsonl");
  EXPECT_EQ(StepsAndKdr(atlas.entries),
            (std::vector<std::pair<int64_t, double>>{{4, -1.0}, {5, -1.5}, {5, -1.5}, {6, -0.7}}));
  EXPECT_EQ(atlas.replaced_entries, 2);
  EXPECT_EQ(atlas.skipped_lines, 0);
}

TEST(ReportAtlas, NullFieldsAreMissingNotZero) {
  const ConflictAtlasFile atlas = ParseConflictAtlasText(
      "{\"step\": 7, \"kdr\": -1.5, \"prompt\": null, \"response\": null, \"token_index\": null,"
      " \"token\": null, \"student_prob\": null, \"teacher_prob\": null, \"teacher_top\": null,"
      " \"advantage\": null, \"reward\": null, \"subset\": null}\n"
      "{\"step\": 8, \"kdr\": -0.5, \"teacher_top\": [{\"token\": \"1\", \"prob\": null}, 3]}\n",
      "a.jsonl");
  ASSERT_EQ(atlas.entries.size(), 2u);
  const AtlasEntry& e = atlas.entries[0];
  EXPECT_EQ(e.step, 7);
  EXPECT_DOUBLE_EQ(e.kdr, -1.5);
  EXPECT_EQ(e.prompt, "");
  EXPECT_FALSE(e.token_index || e.token || e.student_prob || e.teacher_prob || e.advantage ||
               e.reward || e.subset);
  EXPECT_TRUE(e.teacher_top.empty());
  ASSERT_EQ(atlas.entries[1].teacher_top.size(), 1u);  // the non-object left out
  EXPECT_FALSE(atlas.entries[1].teacher_top[0].prob);

  const std::string html = ConflictAtlasSectionHtml(atlas, {});
  EXPECT_EQ(Count(html, "class=\"atlas-row\""), 2u);
  EXPECT_EQ(Count(html, "<mark"), 0u);  // no token to highlight
  EXPECT_EQ(Count(html, "data-table=\"atlas_subset\""), 0u);
  EXPECT_NE(html.find("data-row=\"token_index_unknown\""), std::string::npos);
  EXPECT_FALSE(HasNonFiniteAttribute(html));
}

TEST(ReportAtlas, LocatesTheTokenOnlyWhereItPlausiblySits) {
  auto at = [](const std::string& response, int64_t index, const std::string& token) {
    AtlasEntry e;
    e.response = response;
    e.token_index = index;
    e.token = token;
    return LocateAtlasToken(e);
  };
  EXPECT_EQ(at("25", 0, "2"), std::optional<size_t>(0));
  EXPECT_EQ(at("11", 1, "1"), std::optional<size_t>(1));  // the index decides between equal ones
  EXPECT_EQ(at("é1", 1, "1"), std::optional<size_t>(2));  // characters, not bytes
  EXPECT_EQ(at("Hello world", 1, " world"),
            std::optional<size_t>(5));            // multi-character: its only place
  EXPECT_EQ(at("aXbXc", 7, "X"), std::nullopt);   // ambiguous
  EXPECT_EQ(at("25", 2, "<eos>"), std::nullopt);  // not in the decoded text
  EXPECT_EQ(at("25", 0, ""), std::nullopt);
}

TEST(ReportAtlas, SectionShowsTheMostNegativeRowsEscapedAndHighlighted) {
  std::vector<nlohmann::json> lines;
  for (int step = 1; step <= 15; ++step) {
    lines.push_back(AtlasLine(step, -1.0 - 0.01 * step, "57+68=", "125", 1, "carry_into_hundreds"));
    lines.push_back(AtlasLine(step, -0.5, "1+2=", "3", 0, "rest"));
  }
  lines.push_back(AtlasLine(16, -9.0, "<script>alert(1)</script>", "25", 0, "rest"));
  lines.push_back(AtlasLine(16, -5.0, "1+1=", "2", 1, "rest"));  // the end-of-text token
  const ConflictAtlasFile atlas =
      ParseConflictAtlasText(Lines(lines), "runs/x/conflict_atlas.jsonl");
  AtlasContext context;
  context.positions_by_subset = {{"carry_into_hundreds", 100}, {"rest", 900}};
  const std::string html = ConflictAtlasSectionHtml(atlas, context);

  EXPECT_EQ(Count(html, "data-section=\"conflict_atlas\""), 1u);
  EXPECT_EQ(Count(html, "class=\"atlas-row\""), kAtlasTableRows);
  // Most negative first: the script prompt, the end-of-text token, then step 15's carry.
  const size_t script = html.find("&lt;script&gt;alert(1)&lt;/script&gt;");
  const size_t eos = html.find("<mark class=\"atlas-token atlas-token-apart\"");
  const size_t carry = html.find("data-step=\"15\"");
  ASSERT_NE(script, std::string::npos);
  EXPECT_LT(script, eos);
  EXPECT_LT(eos, carry);
  EXPECT_EQ(html.find("<script>"), std::string::npos);
  EXPECT_NE(html.find("<mark class=\"atlas-token\">2</mark>5"), std::string::npos);
  EXPECT_NE(html.find("1<mark class=\"atlas-token\">2</mark>5"), std::string::npos);
  EXPECT_EQ(Count(html, "<mark class=\"atlas-token\">"), kAtlasTableRows - 1);
  EXPECT_NE(html.find("&lt;eos&gt;</mark>"), std::string::npos);
  EXPECT_NE(html.find("61.0%"), std::string::npos);  // the student's probability
  EXPECT_NE(html.find("width:58px\"></span>97.0%"), std::string::npos);  // the teacher's top token
  // The summary: 32 entries over 16 steps; 15 of them carry (46.9%) where
  // carry has 10% of the positions; token index 1: 16 entries.
  EXPECT_NE(html.find("32 entries over 16 steps (1–16)"), std::string::npos);
  EXPECT_NE(
      html.find(
          "<tr data-row=\"subset_carry_into_hundreds\"><th>carry_into_hundreds</th>"
          "<td class=\"num\">15</td><td class=\"num\">46.9%</td><td class=\"num\">10.0%</td>"),
      std::string::npos);
  EXPECT_NE(html.find("<tr data-row=\"token_index_1\"><th>1</th><td class=\"num\">16</td>"),
            std::string::npos);
  EXPECT_EQ(Count(ConflictAtlasSectionHtml(atlas, context, 3), "class=\"atlas-row\""), 3u);

  const std::string none = ConflictAtlasSectionHtml(absl::NotFoundError("x"), {});
  EXPECT_NE(none.find("has no conflict atlas"), std::string::npos);
  EXPECT_EQ(Count(none, "<table"), 0u);
  const std::string broken = ConflictAtlasSectionHtml(absl::UnavailableError("a <b> c"), {});
  EXPECT_NE(broken.find("could not be read: a &lt;b&gt; c"), std::string::npos);
}

TEST(ReportAtlas, RunPageAndCommandOutcome) {
  const std::string dir = MakeTempDir("kappa_report_atlas");
  WriteFile(dir + "/metrics.jsonl", MetricsText(5));
  const absl::StatusOr<RunReportOutcome> without = WriteRunReport(dir, "");
  ASSERT_TRUE(without.ok()) << without.status();
  const std::string plain = ReadFile(dir + "/report.html");
  EXPECT_NE(plain.find("has no conflict atlas"), std::string::npos);

  // With a corrupted teacher: the subset's share of the K_DR positions is
  // over the steps the atlas covers (2 and 3): 20 + 30 of 230.
  std::vector<nlohmann::json> records;
  for (int step = 1; step <= 5; ++step) {
    records.push_back(StepRecord(step));
    records.back()["kdr_positions_by_subset"] = {{"carry", 10 * step}, {"rest", 90}};
  }
  WriteFile(dir + "/metrics.jsonl", Lines(records));
  WriteFile(dir + "/conflict_atlas.jsonl", Lines({AtlasLine(2, -1.0, "1+1=", "2", 0, "carry"),
                                                  AtlasLine(3, -2.0, "2+2=", "4", 0, "rest")}) +
                                               "garbage\n");
  const absl::StatusOr<RunReportOutcome> with = WriteRunReport(dir, "");
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->skipped_lines, 0);  // metrics.jsonl's
  ASSERT_FALSE(with->problems.empty());
  EXPECT_NE(with->problems.back().find(dir + "/conflict_atlas.jsonl:3:"), std::string::npos)
      << with->problems.back();
  const std::string html = ReadFile(dir + "/report.html");
  const size_t heatmap = html.find("data-chart=\"kdr_position_heatmap\"");
  const size_t section = html.find(
      "<h2>Conflict atlas</h2>\n<section class=\"atlas-section\" "
      "data-section=\"conflict_atlas\">");
  const size_t alarms = html.find("<h2>Alarms</h2>");
  ASSERT_NE(section, std::string::npos);
  EXPECT_LT(heatmap, section);
  EXPECT_LT(section, alarms);
  EXPECT_EQ(Count(html, "class=\"atlas-row\""), 2u);
  EXPECT_NE(html.find("1 malformed line skipped"), std::string::npos);
  EXPECT_NE(html.find("<tr data-row=\"subset_carry\"><th>carry</th><td class=\"num\">1</td>"
                      "<td class=\"num\">50.0%</td><td class=\"num\">21.7%</td>"),
            std::string::npos);
  fs::remove_all(dir);
}

// --- SVG writer

TEST(ReportSvg, PathsPointsGapsAndLogAxis) {
  LineChart c;
  c.id = "t";
  c.title = "t";
  c.y_label = "y";
  c.log_y = true;
  ChartSeries a;
  a.name = "a";
  a.color = "#000";
  // Steps 1..20; NaN at 6..12 (a hole far wider than the spacing), a 0 and
  // a negative value at 15, 16 (not drawable on a log axis), infinity at 18,
  // NaN at 19.
  for (int i = 1; i <= 20; ++i) {
    a.x.push_back(i);
    double y = 0.5 * i;
    if (i >= 6 && i <= 12) y = NAN;
    if (i == 15) y = 0;
    if (i == 16) y = -1;
    if (i == 18) y = INFINITY;
    if (i == 19) y = NAN;
    a.y.push_back(y);
  }
  ChartSeries sparse;  // every 5th step only: one line, not dots
  sparse.name = "sparse";
  sparse.color = "#f00";
  for (int i = 1; i <= 20; ++i) {
    sparse.x.push_back(i);
    sparse.y.push_back(i % 5 == 0 ? 1.0 * i : NAN);
  }
  c.series = {a, sparse};
  c.markers = {{4, "collapse", "step 4", "#f80"}, {14, "collapse", "step 14", "#f80"}};
  c.thresholds = {{10, "threshold", "#f00"}};
  const std::string svg = RenderLineChart(c);

  // a: 1..5 | 13,14 | 17 | 20: breaks where the spacing exceeds 2.5x its
  // median (1).
  const auto segments = Segments(a.x, a.y, true);
  ASSERT_EQ(segments.size(), 4u);
  EXPECT_EQ(segments[0].size(), 5u);
  EXPECT_EQ(segments[1].size(), 2u);
  EXPECT_EQ(segments[2].size(), 1u);
  EXPECT_EQ(segments[3].size(), 1u);
  // Two polylines and two lone points for a, one polyline for sparse.
  EXPECT_EQ(Count(svg, "<path class=\"series-line\" data-series=\"a\""), 2u);
  EXPECT_EQ(Count(svg, "<circle class=\"series-point\" data-series=\"a\""), 2u);
  EXPECT_EQ(Count(svg, "<path class=\"series-line\" data-series=\"sparse\""), 1u);
  EXPECT_EQ(Count(svg, "class=\"event-marker\""), 2u);
  EXPECT_EQ(Count(svg, "class=\"threshold\""), 1u);
  EXPECT_NE(svg.find("data-chart=\"t\""), std::string::npos);
  EXPECT_GT(Count(svg, "class=\"tick y-tick\""), 2u);
  EXPECT_GT(Count(svg, "class=\"tick x-tick\""), 2u);
  EXPECT_FALSE(HasNonFiniteAttribute(svg)) << svg;
  // Points in the paths of a: 5 + 2.
  const std::regex path("data-series=\"a\" d=\"([^\"]*)\"");
  size_t points = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), path); it != std::sregex_iterator();
       ++it) {
    const std::string d = (*it)[1];
    points += Count(d, "M") + Count(d, "L");
  }
  EXPECT_EQ(points, 7u);
}

TEST(ReportSvg, NothingDrawableSaysNoData) {
  LineChart c;
  c.id = "empty";
  c.log_y = true;
  c.series = {{"s", "#000", {1, 2, 3}, {0, -1, NAN}}};
  const std::string svg = RenderLineChart(c);
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_EQ(Count(svg, "<path"), 0u);
  EXPECT_FALSE(HasNonFiniteAttribute(svg));
}

TEST(ReportSvg, HeatmapCellsAndScale) {
  Heatmap h;
  h.id = "h";
  h.title = "h";
  for (int step = 1; step <= 30; ++step) {
    h.x.push_back(step);
    std::vector<double> column;
    for (int b = 0; b < 4; ++b) column.push_back(b == 3 && step % 2 ? NAN : (b - 1.5) * step);
    h.cells.push_back(column);
  }
  h.row_labels = {"0-25%", "25-50%", "50-75%", "75-100%"};
  const std::string svg = RenderHeatmap(h);
  EXPECT_EQ(Count(svg, "class=\"heat-cell\""), 30u * 4 - 15);  // NaN cells are left empty
  EXPECT_EQ(Count(svg, "class=\"scale-cell\""), 21u);
  EXPECT_NE(svg.find("rgb(255,255,255)"), std::string::npos);  // 0 is white
  EXPECT_FALSE(HasNonFiniteAttribute(svg));

  // A long run is binned into at most ~2 px columns.
  Heatmap big = h;
  big.x.clear();
  big.cells.clear();
  for (int step = 1; step <= 5000; ++step) {
    big.x.push_back(step);
    big.cells.push_back({1.0, -1.0});
  }
  const std::string big_svg = RenderHeatmap(big);
  EXPECT_LT(Count(big_svg, "class=\"heat-cell\""), 1400u);
  EXPECT_GT(Count(big_svg, "class=\"heat-cell\""), 400u);
}

TEST(ReportSvg, Ticks) {
  EXPECT_EQ(LinearTicks(0, 1, 5).size(), 6u);
  EXPECT_EQ(LogTicks(0.01, 1000), (std::vector<double>{0.01, 0.1, 1, 10, 100, 1000}));
  EXPECT_EQ(LogTicks(1, 100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_TRUE(LogTicks(0, 10).empty());
  EXPECT_EQ(TickText(1e-5), "1e-5");
  EXPECT_EQ(TickText(30000), "3e4");
  EXPECT_EQ(TickText(0.25), "0.25");
}

// --- the experiment's comparison page

TEST(ReportExperiment, TwoArmsTwoSeeds) {
  const std::string out = MakeTempDir("kappa_report_experiment");
  const std::vector<AblationArm> arms = {{"naive", "L_R + λ L_D", {}, 0},
                                         {"m3_norm", "magnitude normalisation", {}, 0}};
  std::vector<RunResult> results;
  for (const AblationArm& arm : arms) {
    for (uint64_t seed : {1, 2}) {
      RunResult r;
      r.arm = arm.name;
      r.seed = seed;
      r.name = arm.name + "-s" + std::to_string(seed);
      r.status = "ok";
      r.wall_seconds = 95;
      fs::create_directories(out + "/runs/" + r.name);
      WriteFile(out + "/runs/" + r.name + "/metrics.jsonl",
                MetricsText(300, arm.name == "naive" ? 0.0 : 0.1 * seed));
      results.push_back(r);
    }
  }
  RunResult failed;  // no metrics at all: listed, not fatal
  failed.arm = "m3_norm";
  failed.seed = 3;
  failed.name = "m3_norm-s3";
  failed.status = "failed";
  failed.error = "learner exited with 1";
  results.push_back(failed);

  ASSERT_TRUE(WriteExperimentReport(out, "Ablation results: x.yaml", "context", arms, results).ok());
  const std::string html = ReadFile(out + "/report.html");
  for (const char* id : {"exp_eval_accuracy", "exp_reward", "exp_loss_distill", "exp_kappa"}) {
    EXPECT_EQ(Count(html, std::string("data-chart=\"") + id + "\""), 1u) << id;
  }
  for (const AblationArm& arm : arms) {
    EXPECT_EQ(Count(html, "data-arm=\"" + arm.name + "\""), 1u) << arm.name;
    // Mean curve in each of the four charts, plus two faint per-seed ones.
    EXPECT_GE(Count(html, "data-series=\"" + arm.name + "\""), 4u * 3) << arm.name;
  }
  EXPECT_EQ(Count(html, "class=\"run-row\""), 5u);
  EXPECT_NE(html.find("learner exited with 1"), std::string::npos);
  EXPECT_NE(html.find("href=\"runs/naive-s1/report.html\""), std::string::npos);
  EXPECT_TRUE(fs::exists(out + "/runs/m3_norm-s2/report.html"));
  EXPECT_FALSE(HasNonFiniteAttribute(html));
  if (getenv("KAPPA_REPORT_TEST_KEEP") != nullptr) {
    std::cout << "kept " << out << "/report.html\n";
  } else {
    fs::remove_all(out);
  }
}

// --- end to end: the binary, then Chromium

struct Png {
  uint32_t width = 0, height = 0;
  size_t distinct_colors = 0;
  double non_white_fraction = 0;
};

uint32_t BigEndian32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

// Decodes an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) far
// enough to look at its pixels.
std::optional<Png> ReadPng(const std::string& data, std::string* error) {
  static const std::string kSignature("\x89PNG\r\n\x1a\n", 8);
  if (data.compare(0, 8, kSignature) != 0) {
    *error = "no PNG signature";
    return std::nullopt;
  }
  Png png;
  std::string idat;
  int channels = 0;
  for (size_t at = 8; at + 8 <= data.size();) {
    const uint32_t length = BigEndian32(data, at);
    const std::string type = data.substr(at + 4, 4);
    if (at + 12 + length > data.size()) break;
    if (type == "IHDR") {
      png.width = BigEndian32(data, at + 8);
      png.height = BigEndian32(data, at + 12);
      const int depth = uint8_t(data[at + 16]);
      const int color = uint8_t(data[at + 17]);
      const int interlace = uint8_t(data[at + 20]);
      if (depth != 8 || (color != 2 && color != 6) || interlace != 0) {
        *error = "unexpected PNG format: depth " + std::to_string(depth) + " color " +
                 std::to_string(color);
        return std::nullopt;
      }
      channels = color == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      idat += data.substr(at + 8, length);
    }
    at += 12 + length;
  }
  const size_t stride = size_t(png.width) * channels;
  std::vector<uint8_t> raw((stride + 1) * png.height);
  uLongf raw_size = raw.size();
  if (channels == 0 ||
      uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
          Z_OK ||
      raw_size != raw.size()) {
    *error = "cannot inflate IDAT";
    return std::nullopt;
  }
  std::vector<uint8_t> previous(stride, 0), row(stride);
  std::set<uint32_t> colors;
  size_t non_white = 0;
  for (uint32_t y = 0; y < png.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= size_t(channels) ? row[i - channels] : 0;
      const int b = previous[i];
      const int c = i >= size_t(channels) ? previous[i - channels] : 0;
      int predictor = 0;
      switch (filter) {
        case 1: predictor = a; break;
        case 2: predictor = b; break;
        case 3: predictor = (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          predictor = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default: break;
      }
      row[i] = uint8_t(in[i] + predictor);
    }
    for (size_t x = 0; x < png.width; ++x) {
      const uint8_t* p = &row[x * channels];
      colors.insert((uint32_t(p[0]) << 16) | (uint32_t(p[1]) << 8) | p[2]);
      if (p[0] < 240 || p[1] < 240 || p[2] < 240) ++non_white;
    }
    previous.swap(row);
  }
  png.distinct_colors = colors.size();
  png.non_white_fraction = double(non_white) / (double(png.width) * png.height);
  return png;
}

std::string FindChromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    for (const char* dir : {"/usr/bin/", "/usr/local/bin/", "/bin/"}) {
      const std::string path = std::string(dir) + name;
      if (fs::exists(path)) return path;
    }
  }
  return "";
}

std::string RunShell(const std::string& command, int* exit_code) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return output;
}

TEST(ReportEndToEnd, KappaReportBinaryRendersInChromium) {
  const std::string dir = MakeTempDir("kappa_report_e2e");
  const std::string run = dir + "/runs/synthetic";
  fs::create_directories(run);
  WriteFile(run + "/config.yaml", kConfig);
  std::string metrics = MetricsText(60);
  // Step 31's line damaged on disk (line 32), the last record half-written.
  const size_t step31 = metrics.find("\"step\":31,");
  ASSERT_NE(step31, std::string::npos);
  metrics.insert(metrics.rfind('\n', step31) + 1, "#");
  metrics += StepRecord(61).dump().substr(0, 100);
  WriteFile(run + "/metrics.jsonl", metrics);
  // The atlas: two positions a step, a malformed line 5, and among the 25
  // most negative a prompt with markup and an end-of-text token.
  std::vector<nlohmann::json> atlas_lines;
  for (int step = 1; step <= 60; ++step) {
    atlas_lines.push_back(AtlasLine(step, -1.0 - 0.01 * step, "57+68=", "125", 1));
    atlas_lines.push_back(AtlasLine(step, -0.5, "1+2=", "3", 0));
  }
  atlas_lines[20] = AtlasLine(11, -7.0, "<script>alert(1)</script>", "25", 0);
  atlas_lines[40] = AtlasLine(21, -6.0, "1+1=", "2", 1);
  std::string atlas = Lines(atlas_lines);
  atlas.insert(atlas.rfind('\n', atlas.find("\"step\":3,")) + 1, "{oops\n");
  WriteFile(run + "/conflict_atlas.jsonl", atlas);

  const testing::CommandResult usage = testing::RunKappa({"report"});
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  EXPECT_NE(usage.output.find("missing RUN_DIR"), std::string::npos) << usage.output;

  // Without metrics.jsonl: a clear error naming the file.
  const testing::CommandResult missing = testing::RunKappa({"report", dir});
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find(dir + "/metrics.jsonl"), std::string::npos) << missing.output;

  const testing::CommandResult result = testing::RunKappa({"report", run});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(run + "/metrics.jsonl:32:"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("1 malformed line skipped"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("(59 steps;"), std::string::npos) << result.output;  // 1..60 less 31
  EXPECT_NE(result.output.find(run + "/conflict_atlas.jsonl:5:"), std::string::npos)
      << result.output;
  const std::string page = run + "/report.html";
  ASSERT_TRUE(fs::exists(page));
  const std::string html = ReadFile(page);
  EXPECT_FALSE(HasNonFiniteAttribute(html));
  // Self-contained: nothing fetched from anywhere.
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);

  if (getenv("KAPPA_SKIP_BROWSER_TESTS") != nullptr) GTEST_SKIP() << "KAPPA_SKIP_BROWSER_TESTS set";
  const std::string chromium = FindChromium();
  ASSERT_FALSE(chromium.empty()) << "chromium not found: bash scripts/setup.sh installs it "
                                    "(or set KAPPA_SKIP_BROWSER_TESTS=1)";
  // Containers: no sandbox, no /dev/shm, a throwaway profile and HOME.
  const std::string flags = " --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage"
                            " --hide-scrollbars --no-first-run --user-data-dir=" +
                            testing::ShellQuote(dir + "/profile") + " --window-size=1400,6000 ";
  const std::string env = "HOME=" + testing::ShellQuote(dir) + " timeout -k 5 60 ";
  const std::string url = testing::ShellQuote("file://" + page);

  int code = -1;
  const std::string dom =
      RunShell(env + testing::ShellQuote(chromium) + flags + "--dump-dom " + url + " 2>" +
                   testing::ShellQuote(dir + "/dump.log"),
               &code);
  ASSERT_EQ(code, 0) << ReadFile(dir + "/dump.log");
  ASSERT_NE(dom.find("kappa run report: synthetic"), std::string::npos) << dom.substr(0, 2000);
  ASSERT_NE(dom.find("</html>"), std::string::npos);
  for (const std::string& id : RunChartIds()) {
    EXPECT_EQ(Count(dom, "data-chart=\"" + id + "\""), 1u) << id;
  }
  // 60 records, 59 of them with K_DR (step 0 has none), 8 buckets each.
  EXPECT_EQ(Count(dom, "class=\"heat-cell\""), 59u * kBuckets);
  // Alarms at 20, 45 (conflict) and 50 (drowning): on κ and reward, and the
  // two conflicts again on the K_DR chart.
  EXPECT_EQ(Count(dom, "class=\"event-marker\""), 3u * 2 + 2);
  EXPECT_EQ(Count(dom, "class=\"alarm-row\""), 3u);
  EXPECT_GE(Count(dom, "<tr data-row="), 11u);
  EXPECT_NE(dom.find("data-row=\"alarm_magnitude_drowning\""), std::string::npos);
  EXPECT_NE(dom.find("first at step 50"), std::string::npos);
  EXPECT_NE(dom.find("kappa_threshold: 8"), std::string::npos);  // the config, verbatim
  EXPECT_EQ(Count(dom, "class=\"threshold\""), 3u);  // κ, K_DR, cosine 0 line
  EXPECT_NE(dom.find("metrics.jsonl:32:"), std::string::npos);  // the skipped line, on the page
  // The conflict atlas after the heatmap: its 25 most negative positions, the
  // token highlighted in 24 responses and shown apart for the end-of-text one.
  const size_t atlas_section = dom.find("data-section=\"conflict_atlas\"");
  ASSERT_NE(atlas_section, std::string::npos);
  EXPECT_LT(dom.find("data-chart=\"kdr_position_heatmap\""), atlas_section);
  EXPECT_EQ(Count(dom, "class=\"atlas-row\""), 25u);
  EXPECT_EQ(Count(dom, "<mark class=\"atlas-token\">"), 24u);
  EXPECT_EQ(Count(dom, "1<mark class=\"atlas-token\">2</mark>5"), 23u);
  EXPECT_EQ(Count(dom, "<mark class=\"atlas-token atlas-token-apart\""), 1u);
  EXPECT_NE(dom.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(dom.find("<script"), std::string::npos);
  EXPECT_NE(dom.find("conflict_atlas.jsonl:5:"), std::string::npos);

  const std::string png_path = dir + "/report.png";
  RunShell(env + testing::ShellQuote(chromium) + flags + "--screenshot=" +
               testing::ShellQuote(png_path) + " " + url + " >" +
               testing::ShellQuote(dir + "/shot.log") + " 2>&1",
           &code);
  ASSERT_EQ(code, 0) << ReadFile(dir + "/shot.log");
  std::string error;
  const std::optional<Png> png = ReadPng(ReadFile(png_path), &error);
  ASSERT_TRUE(png.has_value()) << error;
  EXPECT_EQ(png->width, 1400u);
  EXPECT_EQ(png->height, 6000u);
  // A rendered page of charts, not a blank or error page: many colours
  // (curves, heatmap, antialiasing) and a fair share of non-white area.
  EXPECT_GT(png->distinct_colors, 200u);
  EXPECT_GT(png->non_white_fraction, 0.05);
  // To look at the page and the screenshot: KAPPA_REPORT_TEST_KEEP=1.
  if (getenv("KAPPA_REPORT_TEST_KEEP") != nullptr) {
    std::cout << "kept " << page << " and " << png_path << "\n";
  } else {
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace kappa::cli
