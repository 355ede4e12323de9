// Translates a worker's kappa.v1.ScoredGroup into the trainer's ScoredGroup
// at the service edge, validating everything the loss relies on. Errors are
// INVALID_ARGUMENT naming the field, e.g. "samples[3].behavior_logprobs: ..."
// or "demonstrations[1].response_tokens[3]: ...".
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kappa/v1/learner.pb.h"
#include "learner/algo/train_batch.h"

namespace kappa::learner {

struct GroupExpectations {
  int64_t group_size = 0;
  // The vocabulary limit (model::VocabLimit: the tokenizer's size): every
  // token id lies below it, and FULL teacher rows are this
  // wide (padded embedding rows above it are in no distribution).
  int64_t vocab_size = 0;
  int64_t max_new_tokens = 0;
  int teacher_form = 0;  // kappa.v1.ScoreForm value the loss needs; 0 = none
  // k the work item asked for under SCORE_FORM_TOPK; rows carry min(k, V).
  int64_t teacher_top_k = 0;
  // D_t of SCORE_FORM_HIDDEN rows: the width of the teacher head the
  // learner holds (TeacherHead::hidden_size); 0 otherwise.
  int64_t teacher_hidden_size = 0;
  // K of WorkItem.teacher_demonstrations: a group may carry at most this many
  // demonstrations, and only when all its rewards are 0; 0 = none allowed.
  int64_t teacher_demonstrations = 0;
  // The student's max_position_embeddings: a prompt and each of its
  // responses (and demonstrations) fit together; 0 = not checked.
  int64_t max_positions = 0;
};

// Teacher log-probs reach the loss as ScoredSample.teacher_logprobs: FULL as
// [T, V], SAMPLED as [T], and TOPK as [T, k] with teacher_topk_ids [T, k]
// (int64), compact as on the wire, and teacher_tail_logmass [T] (float32,
// required: a TOPK sample without it is INVALID_ARGUMENT naming the field),
// and HIDDEN as teacher_hidden [T, D_t] in the dtype sent (float32 or
// bfloat16), D_t = expect.teacher_hidden_size, every value finite.
absl::StatusOr<ScoredGroup> DecodeScoredGroup(const kappa::v1::ScoredGroup& message,
                                              const GroupExpectations& expect);

// The prompt and each response or demonstration fit the student's
// positions together (expect.max_positions; 0: unchecked): a longer row
// would fail inside the step, far from the group that caused it.
// INVALID_ARGUMENT naming the field otherwise.
absl::Status CheckPositions(const kappa::v1::ScoredGroup& message, const GroupExpectations& expect);

// A group's policy_version must name a version this learner has published
// (0 before the first publication); anything else is a worker bug or a group
// from another run, and its importance ratio would be meaningless.
// INVALID_ARGUMENT "policy_version: ..." otherwise.
absl::Status CheckPolicyVersion(int64_t policy_version, int64_t latest_published);

}  // namespace kappa::learner
