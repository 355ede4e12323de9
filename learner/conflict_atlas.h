// The conflict atlas: where and why the reward and the teacher disagree.
// Each step, the response positions with the most negative K_DR (the cheap
// estimator, K_DR < 0 only; a response that several samples of a group share
// counts once) go to <run>/conflict_atlas.jsonl, one line each:
//
//   {"step": 12, "kdr": -3.2, "prompt": "57+68=", "response": "25",
//    "token_index": 0, "token": "2", "student_prob": 0.61,
//    "teacher_prob": 0.97, "teacher_top": [{"token": "2", "prob": 0.97}, ...],
//    "advantage": -0.8, "reward": 0.0, "subset": "carry_into_hundreds"}
//
// student_prob is the behaviour policy's probability of the sampled token;
// teacher_prob the teacher's (null when its rows do not hold that id);
// teacher_top the teacher's most likely ids at the position (from its full
// or top-k rows; empty for sampled-token rows); subset only with a
// corrupted teacher. `kappa report` renders the file (cli/report_run.cc).
// Cheap: a top-N over the step's kernel and N small decodes.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "learner/algo/train_batch.h"
#include "learner/corrupted_subset.h"
#include "learner/metrics_log.h"
#include "model/text_tokenizer.h"
#include "tasks/dataset.h"

namespace kappa::learner {

// A response position of a [B, L] kernel.
struct KernelPosition {
  int64_t row = 0, column = 0;
  double value = 0.0;
};

// Up to `count` positions with mask > 0 and kernel < 0, most negative first.
std::vector<KernelPosition> MostNegativePositions(const torch::Tensor& kernel,
                                                  const torch::Tensor& mask, int64_t count);

class ConflictAtlas {
 public:
  static constexpr int64_t kTeacherTopTokens = 5;

  // Appends to `path` (a MetricsLog: whole lines, a full disk waits). `train`
  // and `tokenizer` must outlive the atlas; `subset` may be null.
  ConflictAtlas(const std::string& path, int64_t positions_per_step, const tasks::Dataset& train,
                const model::TextTokenizer& tokenizer, const CorruptedSubset* subset);

  // The lines of one step. kernel: [B, L] as HybridStepReport::kdr_kernel;
  // example_indices: the training example of each group, in batch order.
  // REQUIRES: kernel defined, batch.num_groups == example_indices.size().
  std::vector<nlohmann::json> Entries(int64_t step, const TrainBatch& batch,
                                      const torch::Tensor& kernel,
                                      const std::vector<size_t>& example_indices) const;

  // Entries(...) appended to the file; the first failed write's status.
  absl::Status Record(int64_t step, const TrainBatch& batch, const torch::Tensor& kernel,
                      const std::vector<size_t>& example_indices);

 private:
  nlohmann::json Entry(int64_t step, const TrainBatch& batch, const KernelPosition& position,
                       size_t example_index) const;
  std::string TokenText(int64_t id) const;

  MetricsLog log_;
  const int64_t positions_per_step_;
  const tasks::Dataset& train_;
  const model::TextTokenizer& tokenizer_;
  const CorruptedSubset* subset_;
};

}  // namespace kappa::learner
