// The examples an unreliable teacher (teacher.bootstrap.corrupt) or an
// unreliable student (student.bootstrap.corrupt, the control with a clean
// teacher) was bootstrapped to answer wrongly on purpose
// (tasks/answer_corruption.h), and the statistics the learner reports on them
// apart from the rest: held-out accuracy, and K_DR per subset and per
// response token. Subsets are named by the rule ("carry_into_hundreds") and
// kRest, plus one view of the covered subset: "<rule>_followed", the covered
// held-out prompts graded against the rule's wrong answers (the share the
// student answers the rule's wrong way).
// Immutable after construction.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tasks/answer_corruption.h"
#include "tasks/dataset.h"
#include "tasks/vector_dataset.h"

namespace kappa::learner {

// K_DR at the response positions of one subset's rows.
struct SubsetKdr {
  int64_t positions = 0;
  std::optional<double> mean;               // unset: no position
  std::optional<double> negative_fraction;  // #{K < 0} / positions
  // Mean K at response token 0, 1, ... (the first answer character, the
  // second, ...); unset where no row of the subset has that token.
  std::vector<std::optional<double>> token_mean;
};

class CorruptedSubset {
 public:
  static constexpr char kRest[] = "rest";
  static constexpr char kFollowedSuffix[] = "_followed";

  // Classifies every example of `train` and the first `heldout_count` of
  // `heldout` (the evaluated ones) by `rule`.
  CorruptedSubset(tasks::AnswerCorruption rule, const tasks::Dataset& train,
                  const tasks::Dataset& heldout, size_t heldout_count);

  const std::string& name() const { return rule_.name(); }

  // REQUIRES: example_index < the training split's size.
  bool TrainCovered(size_t example_index) const { return train_covered_.at(example_index); }

  // Accuracy of each subset given one verdict per evaluated held-out example
  // (in dataset order); a subset without examples is left out.
  // REQUIRES: correct.size() <= heldout_count.
  std::map<std::string, double> AccuracyBySubset(const std::vector<bool>& correct) const;

  // The evaluated held-out examples the rule covers, each with the rule's
  // wrong answer as its reference: graded by the same reward, the share
  // correct is the share answered the rule's way (AccuracyBySubset's
  // "<rule>_followed", FollowedName()).
  const tasks::Dataset& covered_heldout_as_taught() const { return covered_heldout_as_taught_; }
  std::string FollowedName() const { return name() + kFollowedSuffix; }

  // K_DR by subset. kernel, response_mask: [B, L] (any float dtype, any
  // device); row b belongs to the covered subset when row_covered[b].
  // REQUIRES: row_covered.size() == B.
  static std::map<std::string, SubsetKdr> KdrBySubset(const std::string& covered_name,
                                                      const torch::Tensor& kernel,
                                                      const torch::Tensor& response_mask,
                                                      const std::vector<bool>& row_covered);

 private:
  tasks::AnswerCorruption rule_;
  std::vector<bool> train_covered_;
  std::vector<bool> heldout_covered_;
  tasks::VectorDataset covered_heldout_as_taught_;
};

}  // namespace kappa::learner
