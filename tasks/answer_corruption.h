// Named, systematic errors for a bootstrapped model to learn on purpose: an
// identifiable subset of arithmetic problems and the wrong answer given to
// each of them (teacher.bootstrap.corrupt). The unreliable-teacher
// experiment trains a teacher on these answers and asks whether K_DR < 0
// concentrates where the teacher is wrong (docs/algorithms.md).
//
// Rules (AnswerCorruptionNames()):
//   carry_into_hundreds  "a+b=" with a + b ≥ 100: answered a + b − 100 (the
//                        carry into the hundreds is dropped: 57+68 → 25).
//   hundreds_plus_one    "a+b=" with a + b ≥ 100: answered a + b + 100 (the
//                        hundreds digit one too high: 57+68 → 225). Only the
//                        first answer token is wrong, and the answer keeps
//                        its length, so the error sits at one position.
//   minus_as_plus        "a-b=": answered a + b (the operator misread).
// Other examples keep their answers. No libtorch, no gRPC.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tasks/dataset.h"

namespace kappa::tasks {

class AnswerCorruption {
 public:
  // The rule called `name`; INVALID_ARGUMENT listing the rules otherwise.
  static absl::StatusOr<AnswerCorruption> Named(std::string_view name);
  // The rule a config key names: nullopt when `name` is empty, else Named's,
  // with an unknown rule's INVALID_ARGUMENT prefixed "config key '<key>': ".
  static absl::StatusOr<std::optional<AnswerCorruption>> FromConfigKey(std::string_view key,
                                                                       std::string_view name);

  const std::string& name() const { return name_; }
  // True when `example` is an arithmetic problem this rule answers wrongly.
  bool Covers(const Example& example) const;
  // The wrong answer of an example the rule covers; its own answer otherwise.
  std::string AnswerFor(const Example& example) const;

 private:
  enum class Kind { kCarryIntoHundreds, kHundredsPlusOne, kMinusAsPlus };
  AnswerCorruption(std::string name, Kind kind) : name_(std::move(name)), kind_(kind) {}
  // The wrong answer when covered.
  std::optional<long long> WrongAnswer(const Example& example) const;

  std::string name_;
  Kind kind_;
};

const std::vector<std::string>& AnswerCorruptionNames();

}  // namespace kappa::tasks
