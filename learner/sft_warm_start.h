// Supervised warm start of the teacher or the student, shared by `kappa sft`
// and `kappa run`'s bootstrap: build the task's train split, tokenize, train
// a fresh decoder of the role's shape, evaluate held-out greedy accuracy
// before and after, save the checkpoint plus sft_summary.json.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "services/config.h"

namespace kappa::learner {

enum class Role { kTeacher, kStudent };

absl::StatusOr<Role> ParseRole(std::string_view name);  // "teacher" | "student"
const char* RoleName(Role role);
const services::ModelShape& RoleShape(const services::Config& config, Role role);
const services::SftConfig& RoleBootstrap(const services::Config& config, Role role);

struct SftResult {
  std::string checkpoint_dir;
  double accuracy_before = 0.0;  // held-out greedy accuracy of the fresh model
  double train_accuracy = 0.0;   // the same measure on training examples spread over the split
  double accuracy = 0.0;         // after training
  double loss = 0.0;             // NLL of the last step
  int64_t steps = 0;             // steps trained (fewer than configured at a target)
  // With bootstrap.target_accuracy: the target, and whether a check reached
  // it (false: it trained all `steps` short of it).
  double target_accuracy = 0.0;
  bool reached_target = false;
  int64_t train_examples = 0;
  int64_t eval_examples = 0;
  double seconds = 0.0;  // training + evaluation wall time
  // With bootstrap.corrupt: the rule, the chance a covered example was
  // drawn with its wrong answer, the training examples it covers, and on the held-out examples it
  // covers the accuracy against the true answers and the share answered as the rule answers (how
  // well the model learned the error); unset without a rule or covered examples.
  std::string corrupt;
  double corrupt_fraction = 1.0;
  int64_t corrupted_train_examples = 0;
  std::optional<double> covered_accuracy;
  std::optional<double> covered_corrupt_agreement;
  std::optional<double> rest_accuracy;
};

// The summary file written beside the checkpoint's weights.
inline constexpr const char* kSftSummaryFile = "sft_summary.json";

// Trains and saves into `out_dir` (replaced atomically). Progress lines go to
// `log`. Errors name what was wrong (dataset spec, a character the tokenizer
// lacks, sequences longer than max_position_embeddings, ...).
absl::StatusOr<SftResult> RunSft(const services::Config& config, Role role,
                                 const std::string& out_dir, std::ostream& log);

// Reads <dir>/sft_summary.json (NOT_FOUND when absent).
absl::StatusOr<SftResult> ReadSftSummary(const std::string& checkpoint_dir);

}  // namespace kappa::learner
