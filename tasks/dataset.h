// Prompt/answer datasets behind one interface: a seeded arithmetic generator
// and a JSONL loader. No libtorch, no gRPC.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
};

struct ArithmeticSpec {
  int min_digits = 1;                 // Operand digit counts, inclusive range.
  int max_digits = 2;
  std::vector<char> operators = {'+'};  // Any of '+', '-', '*'.
  bool allow_negative = true;         // If false, '-' orders operands so a >= b.
  uint64_t seed = 1;
  size_t train_size = 2000;
  size_t heldout_size = 200;
};

enum class Split { kTrain, kHeldOut };

// Deterministic in spec.seed. Train and held-out never share a prompt: the
// held-out prompts are drawn first and excluded from train. Errors
// (INVALID_ARGUMENT) when the spec is inconsistent or the space of distinct
// problems is too small for the requested sizes.
absl::StatusOr<std::unique_ptr<Dataset>> MakeArithmeticDataset(const ArithmeticSpec& spec,
                                                               Split split);

// One JSON object per line: {"prompt": "...", "answer": "..."} (optional
// "id", "task", "system"). Blank lines are skipped. Errors name the file and line.
absl::StatusOr<std::unique_ptr<Dataset>> LoadJsonlDataset(const std::string& path);

}  // namespace kappa::tasks
