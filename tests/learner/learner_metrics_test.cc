// The learner's Prometheus export of a real training step: every metric the
// dashboards and rules rely on is present, with the step's numbers, and the
// whole scrape passes `promtool check metrics`.
#include "learner/learner_metrics.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "learner/algo/hybrid_step.h"
#include "tests/algo/tiny_model.h"
#include "tests/services/promtool.h"

namespace kappa::learner {
namespace {


TEST(LearnerMetrics, ExportsAStepForPrometheus) {
  model::Decoder model = testing::TinyModel(3);
  HybridStep step(model, std::make_unique<PolicyOptimizer>(model, 1e-3, 0.0, 1.0),
                  HybridStepConfig{});
  const HybridStepReport report =
      step.Run(BuildTrainBatch(testing::RandomGroups(2, 4, true, 9), true, 0));
  ASSERT_TRUE(report.stats.kappa().has_value());
  ASSERT_FALSE(report.kdr_values.empty());

  services::metrics::Registry registry;
  LearnerMetrics metrics(registry);
  StepRecord observed;
  observed.report = report;
  observed.step = 1;
  observed.policy_version = 1;
  observed.reward_mean = 0.5;
  observed.truncated_fraction = 0.25;
  observed.tokens = 30;
  observed.step_seconds = 0.02;
  observed.staleness = {0, 1};
  observed.eval_accuracy = 0.25;
  CoordinatorCounters counters;
  counters.groups_accepted = 7;
  counters.dropped_stale = 2;
  counters.dropped_duplicate = 6;
  counters.dropped_unknown_lease = 1;
  counters.buffered = 3;
  metrics.RecordStep(observed);
  // The coordinator is read at scrape time, as main.cc wires it.
  registry.AddCollectHook([&] {
    metrics.RecordCoordinator(counters);
    metrics.RecordInvalidGroups(4);
  });
  const std::string text = registry.Serialize();

  for (const char* name : {"kappa_learner_step 1\n",
                           "kappa_learner_grad_norm_ratio ",
                           "kappa_learner_grad_norm{signal=\"reward\"} ",
                           "kappa_learner_grad_norm{signal=\"distill\"} ",
                           "kappa_learner_grad_cosine ",
                           "kappa_learner_kdr_bucket{le=\"0\"} ",
                           "kappa_learner_kdr_negative_ratio ",
                           "kappa_learner_kdr_negative_weighted_ratio ",
                           "kappa_learner_loss{term=\"sft\"} 0\n",
                           "kappa_learner_reward_mean 0.5\n",
                           "kappa_learner_truncated_ratio 0.25\n",
                           "kappa_learner_eval_accuracy_ratio 0.25\n",
                           "kappa_learner_entropy ",
                           "kappa_learner_alarm{kind=\"collapse\"} 0\n",
                           "kappa_learner_alarms_total{kind=\"magnitude_drowning\"} 0\n",
                           "kappa_learner_policy_version 1\n",
                           "kappa_learner_staleness_versions_count 2\n",
                           "kappa_learner_groups_dropped_total{reason=\"stale\"} 2\n",
                           "kappa_learner_groups_dropped_total{reason=\"invalid\"} 4\n",
                           "kappa_learner_groups_dropped_total{reason=\"duplicate\"} 6\n",
                           "kappa_learner_groups_dropped_total{reason=\"unknown_lease\"} 1\n",
                           "kappa_learner_groups_total 7\n",
                           "kappa_learner_buffer_groups 3\n",
                           "kappa_learner_step_seconds_count 1\n",
                           "kappa_learner_tokens_total 30\n",
                           "kappa_learner_alarm{kind=\"inference_mismatch\"} 0\n",
                           "kappa_learner_inference_mismatch{stat=\"abs_mean\"} ",
                           "kappa_learner_inference_mismatch{stat=\"k3\"} "}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << " missing from\n" << text;
  }
  // κ exported is the step's κ.
  EXPECT_NE(text.find("kappa_learner_grad_norm_ratio " +
                      services::metrics::FormatValue(*report.stats.kappa())),
            std::string::npos);
  ASSERT_TRUE(report.mismatch_abs_mean.has_value());
  EXPECT_NE(text.find("kappa_learner_inference_mismatch{stat=\"abs_mean\"} " +
                      services::metrics::FormatValue(*report.mismatch_abs_mean)),
            std::string::npos);
  // Every K_DR value landed in the histogram.
  EXPECT_NE(text.find("kappa_learner_kdr_count " + std::to_string(report.kdr_values.size()) + "\n"),
            std::string::npos);
  const auto [status, output] = kappa::testing::PromtoolCheckMetrics(text);
  EXPECT_EQ(status, 0) << output;
  EXPECT_EQ(output, "");

  // Counters follow the coordinator's totals at the next scrape, with no step
  // in between; a total that went down (it cannot, but) never lowers them.
  counters.dropped_stale = 5;
  counters.groups_accepted = 9;
  std::string next = registry.Serialize();
  EXPECT_NE(next.find("kappa_learner_groups_dropped_total{reason=\"stale\"} 5\n"),
            std::string::npos);
  EXPECT_NE(next.find("kappa_learner_groups_total 9\n"), std::string::npos);
  counters.groups_accepted = 4;
  EXPECT_NE(registry.Serialize().find("kappa_learner_groups_total 9\n"), std::string::npos);
}

// A step without on-policy tokens exports no mismatch series (not a 0, not
// NaN); a later measured step does, and the next unmeasured one keeps it.
TEST(LearnerMetrics, MismatchOnlyFromMeasuredSteps) {
  services::metrics::Registry registry;
  LearnerMetrics metrics(registry);
  StepRecord unmeasured;
  unmeasured.step = 1;
  metrics.RecordStep(unmeasured);
  EXPECT_EQ(registry.Serialize().find("kappa_learner_inference_mismatch"), std::string::npos);
  StepRecord nan_step = unmeasured;
  nan_step.report.mismatch_tokens = 3;
  nan_step.report.mismatch_abs_mean = std::nan("");
  nan_step.report.mismatch_k3 = std::nan("");
  metrics.RecordStep(nan_step);
  EXPECT_EQ(registry.Serialize().find("kappa_learner_inference_mismatch"), std::string::npos);
  StepRecord measured = unmeasured;
  measured.report.mismatch_tokens = 12;
  measured.report.mismatch_abs_mean = 0.25;
  measured.report.mismatch_k3 = 0.03125;
  metrics.RecordStep(measured);
  metrics.RecordStep(unmeasured);
  const std::string text = registry.Serialize();
  EXPECT_NE(text.find("kappa_learner_inference_mismatch{stat=\"abs_mean\"} 0.25\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kappa_learner_inference_mismatch{stat=\"k3\"} 0.03125\n"), std::string::npos)
      << text;
  const auto [status, output] = kappa::testing::PromtoolCheckMetrics(text);
  EXPECT_EQ(status, 0) << output;
}

}  // namespace
}  // namespace kappa::learner
