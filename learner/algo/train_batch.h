// Scored groups (as the learner receives them, minus the wire format) and
// their padded tensor form for one training step.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "learner/algo/losses.h"

namespace kappa::learner {

struct ScoredSample {
  std::vector<int64_t> response_tokens;
  std::vector<float> behavior_logprobs;  // log π_old(y_t), one per response token
  float reward = 0.0f;
  // Teacher log-probs per response position: [T, V] full vocabulary, [T] of
  // the sampled tokens only, [T, k] of the ids teacher_topk_ids [T, k] (the
  // teacher's top k; distinct per row), or undefined (no distillation).
  torch::Tensor teacher_logprobs;
  torch::Tensor teacher_topk_ids;  // int64; defined exactly in the top-k form
  // Top-k form: [T] float32, the teacher's log q of the ids outside
  // teacher_topk_ids (TeacherRows::tail_logmass); all samples or none.
  torch::Tensor teacher_tail_logmass;
  // Hidden form: [T, D_t] the teacher's final-normed hidden states (float32
  // or bfloat16, as sent; finite), teacher_logprobs undefined; all samples
  // or none. The learner's TeacherHead turns them into log q.
  torch::Tensor teacher_hidden;
  // The response hit its token budget without a stop id (see TruncatedResponses).
  bool truncated = false;
};

struct ScoredGroup {
  std::vector<int64_t> prompt_tokens;
  std::vector<ScoredSample> samples;
  int64_t policy_version = 0;
  // RSTG teacher SFT: verified-correct teacher responses to the prompt (only
  // for groups whose samples all got reward 0). Trained on with an NLL term.
  std::vector<std::vector<int64_t>> teacher_demonstrations;
};

// Row b holds sequence prompt + response of one sample; position t predicts
// target_tokens[b, t] = sequence[t + 1] from input_tokens[b, 0..t].
// Per-position tensors are zero outside response positions.
struct TrainBatch {
  torch::Tensor input_tokens;      // [B, L] int64, right-padded with pad_id
  torch::Tensor attention_mask;    // [B, L] bool, true at real input tokens
  torch::Tensor target_tokens;     // [B, L] int64
  torch::Tensor response_mask;     // [B, L] float32, 1 where the target is a response token
  torch::Tensor old_logprobs;      // [B, L] float32
  torch::Tensor advantages;        // [B, L] float32, the group advantage of the row
  // Teacher rows as the teacher sent them (TeacherRows): [B, L, V] full,
  // [B, L] sampled, or [B, L, k] top-k with teacher_topk_ids [B, L, k]; or
  // undefined. Top-k rows are never densified: a [B, L, V] teacher tensor
  // exists only for the full-vocabulary losses. Padded top-k positions hold
  // ids 0..k-1 with log-probs log(1/(k+1)) (finite, a non-empty tail).
  torch::Tensor teacher_logprobs;
  torch::Tensor teacher_topk_ids;
  // [B, L] float32 with top-k rows that carry it (padding log(1/(k+1))).
  torch::Tensor teacher_tail_logmass;
  // Hidden form: [B, L, D_t] in the dtype sent (padding 0: a uniform q,
  // finite), with the head that turns a row into log q; teacher_logprobs
  // undefined. The head is set by the caller (BuildTrainBatch leaves it
  // empty): the learner's one frozen copy, already on the model's device.
  torch::Tensor teacher_hidden;
  TeacherHead teacher_head;
  torch::Tensor rewards;  // [num_groups, G] float32, as the advantages saw them
  int64_t num_groups = 0;
  int64_t group_size = 0;
  int64_t num_truncated = 0;  // samples that hit their token budget (ScoredSample.truncated)

  // RSTG teacher SFT rows: prompt + verified teacher response, laid out like
  // the rows above; undefined when no group carries demonstrations.
  torch::Tensor sft_input_tokens;    // [S, L'] int64
  torch::Tensor sft_attention_mask;  // [S, L'] bool
  torch::Tensor sft_target_tokens;   // [S, L'] int64
  torch::Tensor sft_mask;            // [S, L'] float32, 1 at teacher response tokens
  int64_t num_demonstrations = 0;

  TeacherRows teacher() const {
    return {teacher_logprobs, teacher_topk_ids, teacher_tail_logmass, teacher_hidden, teacher_head};
  }
  // Bytes of the teacher rows (log-probs, ids, tails or hidden states) this
  // batch holds; the head is not counted (one copy for the whole run).
  int64_t teacher_bytes() const;

  // Same batch with every tensor on `device` (no copy for tensors already there).
  TrainBatch To(const torch::Device& device) const;
  // The rows `rows` (int64 indices) of every per-row tensor, for per-position
  // work on a few rows (advantages are already per row; rewards and the SFT
  // rows are left out).
  TrainBatch SelectRows(const torch::Tensor& rows) const;
};

// Gradient accumulation: a part of a TrainBatch's rows, cut to the longest
// of them (the rows are right-padded, so the columns dropped are padding).
struct MicroBatch {
  TrainBatch batch;     // the rows (and the SFT rows, with the first micro-batch)
  torch::Tensor rows;   // int64 indices of those rows in the whole batch
  int64_t length = 0;   // columns kept: the whole batch's first `length`
  bool whole = false;   // the whole batch itself, uncut and uncopied

  // [B, L] (or [B, L, …]) tensor of the whole batch → this micro-batch's part.
  torch::Tensor Slice(const torch::Tensor& whole_batch_tensor) const;
  // Writes this micro-batch's part back into a whole-batch tensor.
  void Scatter(const torch::Tensor& part, torch::Tensor& whole_batch_tensor) const;
};

// Splits `batch` into micro-batches of at most `max_sequences` rows,
// bucketed by length: rows sorted by their number of real input tokens, so
// each micro-batch pads only to its own longest row. max_sequences <= 0 or
// >= the batch's rows: one micro-batch, the batch itself.
std::vector<MicroBatch> SplitMicroBatches(const TrainBatch& batch, int64_t max_sequences);

// trainer.truncated: how a truncated response (one that hit its token budget
// without a stop id or string) trains.
enum class TruncatedResponses {
  kKeep,        // as any other response (verl's default)
  kMask,        // none of its positions is in response_mask, so it adds nothing
                // to L_R, L_D or their token counts; its reward still enters
                // the group's mean and std (DAPO's overlong filtering masks the
                // loss only)
  kZeroReward,  // its reward is 0 before the group advantages (and in `rewards`)
};

// "keep" | "mask" | "zero_reward"; throws std::invalid_argument listing them.
TruncatedResponses ParseTruncatedResponses(const std::string& name);

// What BuildTrainBatch throws for one group it cannot use: group() is the
// group's index in its argument, so a caller can leave that group out and
// build from the others.
class BadGroupError : public std::invalid_argument {
 public:
  BadGroupError(size_t group, const std::string& what)
      : std::invalid_argument(what), group_(group) {}
  size_t group() const { return group_; }

 private:
  size_t group_;
};

// Throws BadGroupError naming the group and sample on inconsistent input
// (std::invalid_argument for no groups at all): unequal group sizes (the
// group unlike the first is named), empty prompts or responses,
// behavior log-prob count != response length, negative token ids, teacher
// log-probs of the wrong shape, teacher log-probs present on some samples
// but not others or in different forms (top-k rows of different k, top-k
// ids that are not int64 or repeat within a row, a tail mass on some top-k
// samples but not others or not of shape [T], hidden rows not [T, D_t] of
// one width or not finite), or empty demonstrations. `truncated` applies to
// samples with ScoredSample.truncated (kKeep: the batch is as if none were).
// The advantages are GrpoAdvantages(rewards, norm_std, advantage_std).
TrainBatch BuildTrainBatch(const std::vector<ScoredGroup>& groups, bool norm_std, int64_t pad_id,
                           TruncatedResponses truncated = TruncatedResponses::kKeep,
                           AdvantageStd advantage_std = AdvantageStd::kPopulation);

}  // namespace kappa::learner
