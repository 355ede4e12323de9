// Checking the reward on one's own data before a run:
//   kappa grade --reward math|math_strict|exact|task < lines.jsonl
//       stdin: one JSON object per line, {"response": "...", "answer": "..."}
//       (other members are ignored); stdout: the reward of each line, 1 or 0.
// The rewards are the verifier's, and --reward takes verifier.reward's names
// (tasks::RewardFamily): "math" and "math_strict" are those task families
// (tasks/math_answer.h, docs/grading.md), "exact" is the arithmetic
// exact-answer reward (tasks/answer.h), "task" (or empty) grades each line
// by its own "task" member (absent: arithmetic), as the verifier does without
// verifier.reward. "code" is refused (exit 2): it runs the sandbox, which
// only kappa-verifier has. Output is flushed line by line.
// Exit status: 0 done; 1 a line is not such an object, its answer is not a
// valid reference for the reward, or (task) its "task" is unknown or code
// (the message names the stdin line); 2 bad arguments.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace kappa::cli {

int GradeCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out);

}  // namespace kappa::cli
