// Seeded arithmetic problems ("12+34=" -> "46").
//
// Reproducibility: std::mt19937_64 is fully specified by the standard, but
// std::uniform_int_distribution is not, so the integer draws below are done by
// hand (rejection sampling) and give the same problems on every toolchain.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tasks/dataset.h"
#include "tasks/vector_dataset.h"

namespace kappa::tasks {
namespace {

constexpr int kMaxDigits = 9;  // products of two 9-digit operands fit in int64

// Uniform integer in [lo, hi] (inclusive), identical on every platform.
uint64_t UniformInt(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
  const uint64_t range = hi - lo + 1;  // 0 means the full 2^64 range
  if (range == 0) return rng();
  // Reject the low `2^64 mod range` values so that `x % range` is unbiased.
  const uint64_t threshold = (0 - range) % range;
  uint64_t x;
  do {
    x = rng();
  } while (x < threshold);
  return lo + x % range;
}

uint64_t Pow10(int n) {
  uint64_t value = 1;
  for (int i = 0; i < n; ++i) value *= 10;
  return value;
}

// Smallest operand with `digits` digits; single digits include 0.
uint64_t MinOperand(int digits) { return digits == 1 ? 0 : Pow10(digits - 1); }

struct Problem {
  std::string prompt;
  std::string answer;
};

class ProblemSampler {
 public:
  ProblemSampler(const ArithmeticSpec& spec, std::vector<char> operators)
      : spec_(spec), operators_(std::move(operators)), rng_(spec.seed) {}

  Problem Next() {
    const char op = operators_[UniformInt(rng_, 0, operators_.size() - 1)];
    int64_t a = Operand();
    int64_t b = Operand();
    if (op == '-' && !spec_.allow_negative && a < b) std::swap(a, b);
    int64_t result = 0;
    switch (op) {
      case '+': result = a + b; break;
      case '-': result = a - b; break;
      default: result = a * b; break;
    }
    return {absl::StrCat(a, std::string(1, op), b, "="), absl::StrCat(result)};
  }

 private:
  int64_t Operand() {
    const int digits = static_cast<int>(UniformInt(rng_, spec_.min_digits, spec_.max_digits));
    return static_cast<int64_t>(UniformInt(rng_, MinOperand(digits), Pow10(digits) - 1));
  }

  const ArithmeticSpec& spec_;
  const std::vector<char> operators_;
  std::mt19937_64 rng_;
};

// Distinct operators in first-seen order, or an error for unknown ones.
absl::StatusOr<std::vector<char>> DistinctOperators(const std::vector<char>& operators) {
  if (operators.empty()) return absl::InvalidArgumentError("arithmetic: no operators");
  std::vector<char> distinct;
  for (char op : operators) {
    if (op != '+' && op != '-' && op != '*') {
      return absl::InvalidArgumentError(
          absl::StrCat("arithmetic: unknown operator '", std::string(1, op), "' (use + - *)"));
    }
    if (std::find(distinct.begin(), distinct.end(), op) == distinct.end()) {
      distinct.push_back(op);
    }
  }
  return distinct;
}

// Number of distinct prompts the spec can produce.
uint64_t ProblemSpace(const ArithmeticSpec& spec, const std::vector<char>& operators) {
  const uint64_t n = Pow10(spec.max_digits) - MinOperand(spec.min_digits);
  uint64_t total = 0;
  for (char op : operators) {
    total += (op == '-' && !spec.allow_negative) ? n * (n + 1) / 2 : n * n;
  }
  return total;
}

// The first `wanted` distinct problems of the spec's stream, in draw order.
absl::StatusOr<std::vector<Problem>> DrawDistinct(const ArithmeticSpec& spec,
                                                  const std::vector<char>& operators,
                                                  uint64_t wanted) {
  ProblemSampler sampler(spec, operators);
  std::unordered_set<std::string> seen;
  seen.reserve(wanted);
  // Draws are not uniform over problems (digit count first), so a space that
  // is nearly exhausted may need many draws; bound them rather than spin.
  const uint64_t max_draws = 64 * wanted + (1u << 20);
  std::vector<Problem> problems;
  problems.reserve(wanted);
  for (uint64_t draws = 0; problems.size() < wanted;) {
    if (++draws > max_draws) {
      return absl::InvalidArgumentError(
          absl::StrCat("arithmetic: could not draw ", wanted, " distinct problems in ", max_draws,
                       " draws; widen the digit range or lower the sizes"));
    }
    Problem problem = sampler.Next();
    if (seen.insert(problem.prompt).second) problems.push_back(std::move(problem));
  }
  return problems;
}

// Whether the i-th distinct problem drawn is held out (ArithmeticSpec::heldout_draw).
bool IsHeldOut(const ArithmeticSpec& spec, size_t i) {
  if (spec.heldout_draw == ArithmeticSpec::HeldOutDraw::kFirst) return i < spec.heldout_size;
  // Problem i is held out when it carries the running count of held-out
  // problems, heldout_size * (i + 1) / total, over an integer.
  const uint64_t total = spec.train_size + spec.heldout_size;
  return (spec.heldout_size * (i + 1)) / total > (spec.heldout_size * i) / total;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> MakeArithmeticDataset(const ArithmeticSpec& spec,
                                                               Split split) {
  if (spec.min_digits < 1 || spec.max_digits > kMaxDigits || spec.min_digits > spec.max_digits) {
    return absl::InvalidArgumentError(
        absl::StrCat("arithmetic: digits must satisfy 1 <= min_digits <= max_digits <= ",
                     kMaxDigits, " (got ", spec.min_digits, "..", spec.max_digits, ")"));
  }
  absl::StatusOr<std::vector<char>> operators = DistinctOperators(spec.operators);
  if (!operators.ok()) return operators.status();

  const uint64_t space = ProblemSpace(spec, *operators);
  const uint64_t wanted = static_cast<uint64_t>(spec.train_size) + spec.heldout_size;
  if (wanted > space) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arithmetic: ", spec.train_size, " train + ", spec.heldout_size,
        " held-out problems requested but only ", space,
        " distinct problems exist for digits ", spec.min_digits, "..", spec.max_digits,
        " and operators '", std::string(operators->begin(), operators->end()), "'"));
  }

  absl::StatusOr<std::vector<Problem>> problems = DrawDistinct(spec, *operators, wanted);
  if (!problems.ok()) return problems.status();
  std::vector<Example> examples;
  size_t index_in_split[2] = {0, 0};
  for (size_t i = 0; i < problems->size(); ++i) {
    const Split drawn = IsHeldOut(spec, i) ? Split::kHeldOut : Split::kTrain;
    const size_t id = index_in_split[drawn == Split::kHeldOut]++;
    if (drawn != split) continue;
    Problem& problem = (*problems)[i];
    examples.push_back(Example{absl::StrCat(drawn == Split::kHeldOut ? "heldout-" : "train-", id),
                               std::move(problem.prompt), std::move(problem.answer), "arithmetic",
                               /*system=*/""});
  }
  return std::unique_ptr<Dataset>(new VectorDataset(std::move(examples)));
}

}  // namespace kappa::tasks
