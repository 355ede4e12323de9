// What the run configuration asks of every work item and, symmetrically,
// what the learner then accepts back in a ScoredGroup. Kept in one place so
// the two cannot drift apart (a worker that obeys the WorkItem must never
// have its group rejected).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "learner/group_decoder.h"
#include "services/config.h"

namespace kappa::learner {

// What every work item asks of the worker.
struct WorkTemplate {
  int32_t group_size = 8;
  int32_t max_new_tokens = 8;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  uint64_t sampling_seed = 0;  // the RL seed: each item's seed mixes it with its lease id
  int32_t teacher_form = 0;  // kappa.v1.ScoreForm; 0 = no teacher data
  int32_t teacher_top_k = 0;  // k of SCORE_FORM_TOPK (trainer.distill_topk); 0 otherwise
  // RSTG teacher SFT: K teacher responses for negative zero-variance groups; 0 = never.
  int32_t teacher_demonstrations = 0;
  float teacher_temperature = 1.0f;
  // kappa.v1.DType of the teacher values (trainer.teacher_values): FLOAT32 or BFLOAT16.
  int32_t teacher_value_dtype = 1;
  int32_t max_outstanding_limit = 16;  // cap on a worker's Hello.max_outstanding
  // The student's stop ids (model::StopTokenIds); empty: the worker uses the
  // policy's config.json eos_token_id. Not from the run configuration:
  // main sets it from the checkpoint.
  std::vector<int32_t> stop_token_ids;
  // model::VocabLimit of the tokenizer's size; 0: every row. Set by main.
  int32_t vocab_limit = 0;
  std::vector<std::string> stop_strings;  // rollout.stop_strings
};

// The kappa.v1.ScoreForm of teacher log-probs the loss will read; 0 when it
// reads none, so workers skip Teacher.Score entirely.
// topk_reverse_kl and topk_tail_reverse_kl ask for SCORE_FORM_TOPK (FULL under RSTG's token_prob
// confidence, which needs q of tokens outside the top-k). Under teacher.rows:
// hidden, SCORE_FORM_HIDDEN replaces FULL and SAMPLED.
int32_t TeacherFormFor(const services::Config& config);

// k of the TOPK form (trainer.distill_topk; the worker and the group decoder
// cap it at the vocabulary size); 0 for every other form.
int32_t TeacherTopKFor(const services::Config& config);

// K teacher demonstrations per negative zero-variance group; 0 unless the
// RSTG gate is on and its SFT term has weight.
int32_t TeacherDemonstrationsFor(const services::Config& config);

WorkTemplate WorkTemplateFor(const services::Config& config);

// The checks DecodeScoredGroup applies to groups answering `work`; vocab_size
// is the vocabulary limit (the one work.vocab_limit carries to the workers).
GroupExpectations GroupExpectationsFor(const WorkTemplate& work, int64_t vocab_size);

}  // namespace kappa::learner
