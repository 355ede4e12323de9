// What the run configuration makes the learner ask of workers (teacher
// log-prob form, RSTG teacher demonstrations) and accept back.
#include "learner/work_config.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kappa/v1/teacher.pb.h"

namespace kappa::learner {
namespace {

services::Config Base() {
  services::Config config;
  config.trainer.distill_gate = services::DistillGate::kAll;
  config.trainer.distill_loss = services::DistillLoss::kReverseKl;
  config.trainer.lambda = 1.0;
  return config;
}

TEST(WorkConfig, TeacherFormFollowsTheLoss) {
  services::Config config = Base();
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_FULL);
  config.trainer.distill_loss = services::DistillLoss::kForwardKl;
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_FULL);
  // Only the teacher's top-k cross the wire.
  config.trainer.distill_loss = services::DistillLoss::kTopkReverseKl;
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_TOPK);
  config.trainer.distill_loss = services::DistillLoss::kSampledReverseKl;
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_SAMPLED);
}

TEST(WorkConfig, NoTeacherScoresWithoutDistillation) {
  services::Config config = Base();
  config.trainer.distill_gate = services::DistillGate::kNone;
  EXPECT_EQ(TeacherFormFor(config), 0);
  config = Base();
  config.trainer.lambda = 0.0;
  EXPECT_EQ(TeacherFormFor(config), 0);
  // ... unless a balancer sets the distillation scale regardless of λ.
  config.trainer.balance = {services::BalanceMethod::kM3Adapt};
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_FULL);
  config.trainer.balance = {services::BalanceMethod::kM3Norm, services::BalanceMethod::kM3Project};
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_FULL);
}

TEST(WorkConfig, RstgMaxProbConfidenceNeedsTheFullDistribution) {
  services::Config config = Base();
  config.trainer.distill_gate = services::DistillGate::kRstg;
  config.trainer.distill_loss = services::DistillLoss::kSampledReverseKl;
  config.rstg.confidence = services::RstgConfidence::kMaxProb;
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_FULL);
  config.rstg.confidence = services::RstgConfidence::kTokenProb;
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_SAMPLED);
}

TEST(WorkConfig, TopkReverseKlAsksForTheTopkFormWithTheLossK) {
  services::Config config = Base();
  config.trainer.distill_loss = services::DistillLoss::kTopkReverseKl;
  config.trainer.distill_topk = 5;
  EXPECT_EQ(TeacherTopKFor(config), 5);
  WorkTemplate work = WorkTemplateFor(config);
  EXPECT_EQ(work.teacher_form, kappa::v1::SCORE_FORM_TOPK);
  EXPECT_EQ(work.teacher_top_k, 5);
  // The decoder checks the rows against the same k.
  GroupExpectations expect = GroupExpectationsFor(work, 51);
  EXPECT_EQ(expect.teacher_form, kappa::v1::SCORE_FORM_TOPK);
  EXPECT_EQ(expect.teacher_top_k, 5);

  // RSTG's max_prob confidence reads the top-1: TOPK still suffices.
  config.trainer.distill_gate = services::DistillGate::kRstg;
  config.rstg.confidence = services::RstgConfidence::kMaxProb;
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_TOPK);
  EXPECT_EQ(WorkTemplateFor(config).teacher_top_k, 5);
  // token_prob reads q(y_t), possibly outside the top-k: full rows.
  config.rstg.confidence = services::RstgConfidence::kTokenProb;
  EXPECT_EQ(TeacherFormFor(config), kappa::v1::SCORE_FORM_FULL);
  EXPECT_EQ(TeacherTopKFor(config), 0);

  // Every other form carries no k.
  config = Base();
  config.trainer.distill_topk = 5;
  for (const char* loss : {"reverse_kl", "forward_kl", "sampled_reverse_kl"}) {
    config.trainer.distill_loss = *services::ChoiceNamed<services::DistillLoss>(loss);
    EXPECT_EQ(WorkTemplateFor(config).teacher_top_k, 0) << loss;
  }
  config.trainer.distill_loss = services::DistillLoss::kTopkReverseKl;
  config.trainer.distill_gate = services::DistillGate::kNone;
  work = WorkTemplateFor(config);
  EXPECT_EQ(work.teacher_form, 0);
  EXPECT_EQ(work.teacher_top_k, 0);
}

TEST(WorkConfig, TeacherValuesAskForTheirWireDtype) {
  services::Config config = Base();
  EXPECT_EQ(WorkTemplateFor(config).teacher_value_dtype, kappa::v1::DTYPE_FLOAT32);
  config.trainer.teacher_values = services::Precision::kBFloat16;
  EXPECT_EQ(WorkTemplateFor(config).teacher_value_dtype, kappa::v1::DTYPE_BFLOAT16);
  config.trainer.teacher_values = services::Precision::kFloat32;
  EXPECT_EQ(WorkTemplateFor(config).teacher_value_dtype, kappa::v1::DTYPE_FLOAT32);
}

TEST(WorkConfig, TeacherDemonstrationsOnlyForRstgWithSftWeight) {
  services::Config config = Base();
  config.rstg.teacher_samples = 5;
  config.rstg.sft_weight = 0.1;
  config.rstg.teacher_temperature = 0.7;
  EXPECT_EQ(TeacherDemonstrationsFor(config), 0);  // gate "all"
  config.trainer.distill_gate = services::DistillGate::kNone;
  EXPECT_EQ(TeacherDemonstrationsFor(config), 0);
  config.trainer.distill_gate = services::DistillGate::kRstg;
  EXPECT_EQ(TeacherDemonstrationsFor(config), 5);
  config.rstg.sft_weight = 0.0;
  EXPECT_EQ(TeacherDemonstrationsFor(config), 0);
  config.rstg.sft_weight = 0.1;
  config.rstg.teacher_samples = 0;
  EXPECT_EQ(TeacherDemonstrationsFor(config), 0);

  config.rstg.teacher_samples = 5;
  config.trainer.group_size = 6;
  config.rollout.max_new_tokens = 7;
  const WorkTemplate work = WorkTemplateFor(config);
  EXPECT_EQ(work.teacher_demonstrations, 5);
  EXPECT_FLOAT_EQ(work.teacher_temperature, 0.7f);
  EXPECT_EQ(work.group_size, 6);
  EXPECT_EQ(work.max_new_tokens, 7);
  // What the learner accepts back matches what it asked for.
  const GroupExpectations expect = GroupExpectationsFor(work, 51);
  EXPECT_EQ(expect.teacher_demonstrations, 5);
  EXPECT_EQ(expect.group_size, 6);
  EXPECT_EQ(expect.max_new_tokens, 7);
  EXPECT_EQ(expect.vocab_size, 51);
  EXPECT_EQ(expect.teacher_form, work.teacher_form);
}

}  // namespace
}  // namespace kappa::learner
