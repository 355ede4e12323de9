// The reward of the "math" and "math_strict" task families (tasks/answer.h
// dispatches to it; docs/grading.md is the user's version of these rules, and
// tests/tasks/math_grader_cases.jsonl checks them row by row).
//
// 1. The response's final answer (ExtractMathAnswer), the first that applies:
//    * the last \boxed{...} or \fbox{...}, braces nested (\{ and \} are
//      characters, not braces); or "\boxed X", read up to the next '$'. Only
//      the last box counts: if it never closes, there is no box; if it is
//      empty, the answer is empty (reward 0, no earlier answer is looked for);
//    * not strict only: the rest of the line after the last "####";
//    * not strict only: the last number: '-'? digits, optionally grouped in
//      threes by ",", "{,}" or ",\!", optionally with ".digits" (so the
//      period that ends a sentence is not part of it); or '-'?".digits".
//    "math_strict" requires the box: without one the reward is 0.
// 2. The reference: a full GSM8K solution ("... #### 72") is cut to what
//    follows its last "####" (MathReferenceAnswer).
// 3. Both sides are normalized (NormalizeMathAnswer), in this order:
//    trim; remove \$ and $; remove \left and \right (not \leftarrow);
//    \dfrac and \tfrac become \frac; remove \% and %; remove ^{\circ} and
//    ^\circ; drop a trailing unit \text{ unit} (its text starts with a
//    space; optionally followed by a power such as ^2); unwrap the other
//    \text{...}; remove the thousands separators {,} and ,\! (and the
//    spaces after it); remove plain commas only when the whole answer is a
//    grouped number such as -1,234,567.5; remove all whitespace; brace the
//    one-character arguments of \frac and \sqrt (\frac34 -> \frac{3}{4},
//    \frac3{4} -> \frac{3}{4}, \sqrt3 -> \sqrt{3}).
// 3b. The response's side only, and only when the normalized reference holds
//    no '=' (an equation as the reference is compared as one): a single
//    assignment to a one-letter variable, "x=" then a right side without a
//    further '=', becomes its right side (AssignedValue): "x=2" -> "2",
//    "k=\frac{1}{3}" -> "\frac{1}{3}"; "x=2,y=3", "2x=4" and "x_1=2" stay.
//    Math-Verify does the same (the last relation's right side of a response
//    equation whose reference is not one); Hendrycks, DAPO and DeepScaleR
//    strip "x=" on both sides, kappa never touches the reference.
// 4. Comparison (MathAnswersEqual): an empty side never matches. When both
//    normalized sides are exact numbers (ParseExactNumber: '-'? then a
//    decimal D, D/D, or \frac{-?D}{-?D}; D is "12", "1.50", ".5" or "5."),
//    they are compared as exact rationals (0.5 = 1/2 = \frac{2}{4}; 0.333 is
//    not 1/3). Otherwise the normalized strings must be equal (case matters).
//    Bound: a number is exact only if every numerator and denominator as
//    written (digits without the point, trailing zeros after the point
//    dropped) and the reduced fraction are below 2^64 (any 19 digits fit);
//    a longer number compares as a string.
// No symbolic maths: \sqrt{4} is not 2, "2x=4" is not "x=2", order in
// lists and tuples matters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kappa::tasks {

// The content of the response's last box (rule 1, first item), or nullopt if
// it has none or its last box never closes.
std::optional<std::string> LastBoxedAnswer(std::string_view response);

// The last number of `text` as written ("1,000.5", "-7"), or nullopt.
std::optional<std::string> LastNumber(std::string_view text);

// Rule 1: the final answer of a response, as written; nullopt: none.
std::optional<std::string> ExtractMathAnswer(std::string_view response, bool strict);

// Rule 2: what follows the last "####" (trimmed), else the whole reference.
std::string_view MathReferenceAnswer(std::string_view reference);

// Rule 3.
std::string NormalizeMathAnswer(std::string_view answer);

// An exact number in lowest terms; zero is never negative.
struct Rational {
  bool negative = false;
  uint64_t numerator = 0;
  uint64_t denominator = 1;

  friend bool operator==(const Rational& a, const Rational& b) {
    return a.negative == b.negative && a.numerator == b.numerator && a.denominator == b.denominator;
  }
};

// Rule 4's exact numbers, read from a normalized answer; nullopt if it is not
// one, divides by zero or exceeds the 64-bit bound.
std::optional<Rational> ParseExactNumber(std::string_view normalized);

// Rule 3b on a normalized answer: the right side of "x=..." (one letter, one
// '='), else `normalized` unchanged.
std::string_view AssignedValue(std::string_view normalized);

// Rule 4 on two raw answers (both are normalized here; symmetric, so no rule
// 3b: MathReward applies it to the response).
bool MathAnswersEqual(std::string_view a, std::string_view b);

// 1.0 if the response's final answer equals the reference's, else 0.0.
float MathReward(std::string_view reference, std::string_view response, bool strict);

}  // namespace kappa::tasks
