// Prompt/answer datasets behind one interface: a seeded arithmetic generator
// and a JSONL loader. No libtorch, no gRPC.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kappa::tasks {

struct Example {
  std::string id;      // Stable and unique within a dataset, e.g. "train-17".
  std::string prompt;  // e.g. "12+34="
  std::string answer;  // Reference answer, e.g. "46"
  std::string task = "arithmetic";  // Verifier task family.
  // The system message of this example's chat prompt (task.prompt_template:
  // chat); empty: task.system_prompt, if any.
  std::string system;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual const Example& at(size_t index) const = 0;
  // Malformed lines a JSONL dataset skipped (JsonlOptions::skip_bad_lines),
  // and the error of the first of them ("file:line: ..."); 0 and "" otherwise.
  virtual size_t skipped_lines() const { return 0; }
  virtual std::string first_skipped_error() const { return ""; }
};

struct ArithmeticSpec {
  int min_digits = 1;                 // Operand digit counts, inclusive range.
  int max_digits = 2;
  std::vector<char> operators = {'+'};  // Any of '+', '-', '*'.
  bool allow_negative = true;         // If false, '-' orders operands so a >= b.
  uint64_t seed = 1;
  size_t train_size = 2000;
  size_t heldout_size = 200;
  // Which of the distinct problems drawn are held out:
  //   kFirst: the first heldout_size, then train_size more for training;
  //     the held-out set does not depend on train_size, but since operand
  //     digit counts are drawn first, a large one takes most of the few
  //     one-digit sums (100 of 10,000 two-digit problems, a quarter of the
  //     draws) and the training split is left harder than the held-out one.
  //   kInterleaved: of the first train_size + heldout_size distinct
  //     problems, every (total / heldout_size)-th, evenly spaced; both
  //     splits then have the same mix of problems.
  enum class HeldOutDraw { kFirst, kInterleaved } heldout_draw = HeldOutDraw::kFirst;
};

enum class Split { kTrain, kHeldOut };

// Deterministic in spec.seed. Train and held-out never share a prompt (see
// ArithmeticSpec::heldout_draw for which are held out). Errors
// (INVALID_ARGUMENT) when the spec is inconsistent or the space of distinct
// problems is too small for the requested sizes.
absl::StatusOr<std::unique_ptr<Dataset>> MakeArithmeticDataset(const ArithmeticSpec& spec,
                                                               Split split);

// How a JSONL line maps to an Example (the task.* keys of the same names,
// docs/grading.md#datasets).
struct JsonlOptions {
  std::string prompt_key = "prompt";  // The member holding the prompt text.
  // When set, the member holding a list of {"role", "content"} messages
  // instead: the last "user" message's content is the prompt, a leading
  // "system" message the example's system prompt; other messages are ignored.
  std::string messages_key;
  std::string answer_key = "answer";
  // "" (the keys above) | "gsm8k" (question / answer, family math) | "math"
  // (problem / solution, the reference is the solution's last \boxed{}
  // content, family math). A preset replaces the keys left at their defaults.
  std::string format;
  // The task family of a line without its own "task" member; "": the
  // format's (math), else arithmetic.
  std::string family;
  // false: a malformed line is an error naming file:line; true: it is
  // skipped and counted (Dataset::skipped_lines()).
  bool skip_bad_lines = false;
  // true: a line whose task is "code" is kept, its answer being the Python
  // tests (non-empty); false: such a line is an error, as for every other
  // unknown task. Only the verifier's --code-tasks sets it (it alone runs
  // code, in its sandbox).
  bool code_tasks = false;
};

// OK, or INVALID_ARGUMENT naming the member ("format: unknown format 'x' ...").
absl::Status ValidateJsonlOptions(const JsonlOptions& options);

// One JSON object per line: {"prompt": "...", "answer": "..."} (optional
// "id", "task", "system"; other keys per `options`). Blank lines are skipped.
// Errors name the file and line. Under skip_bad_lines a file whose every
// non-blank line is malformed is still an error.
absl::StatusOr<std::unique_ptr<Dataset>> LoadJsonlDataset(const std::string& path,
                                                          const JsonlOptions& options = {});

}  // namespace kappa::tasks
