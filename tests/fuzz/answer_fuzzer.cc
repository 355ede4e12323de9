// Fuzzes what the verifier does with untrusted text before any sandbox runs:
// the exact-answer reward (tasks/answer.h: ParseFinalAnswer, ValidateReference,
// ExactAnswerReward), the code-block extraction (ExtractPythonCode) and the
// UTF-8 check (base/utf8.h). The input is "<reference>\0<response>" (no
// NUL: all of it is both). Crashes and broken invariants are findings.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/utf8.h"
#include "tasks/answer.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

void CheckFinalAnswer(std::string_view response) {
  const std::optional<std::string> answer = kappa::tasks::ParseFinalAnswer(response);
  if (!answer.has_value()) return;
  // Canonical text is its own canonical form, and a valid reference.
  Check(!answer->empty());
  Check(kappa::tasks::ParseFinalAnswer(*answer) == answer);
  Check(kappa::tasks::ValidateReference("arithmetic", *answer).ok());
}

void CheckReward(std::string_view reference, std::string_view response) {
  const absl::StatusOr<float> reward =
      kappa::tasks::ExactAnswerReward("arithmetic", reference, response);
  Check(reward.ok() == kappa::tasks::ValidateReference("", reference).ok());
  if (!reward.ok()) return;
  Check(*reward == 0.0f || *reward == 1.0f);
  // The reference itself, as the last line of a response, earns the reward.
  const std::string echoed = std::string("the answer is\n") + std::string(reference);
  Check(*kappa::tasks::ExactAnswerReward("", reference, echoed) == 1.0f);
}

void CheckPythonCode(std::string_view response) {
  const std::string_view code = kappa::tasks::ExtractPythonCode(response);
  // A view into the response, never past its end.
  Check(code.data() >= response.data());
  Check(code.data() + code.size() <= response.data() + response.size());
}

void CheckUtf8(std::string_view text) {
  const bool valid = kappa::base::IsValidUtf8(text);
  // Valid UTF-8 stays valid split at any character boundary.
  if (valid && !text.empty()) {
    size_t cut = text.size() / 2;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    Check(kappa::base::IsValidUtf8(text.substr(0, cut)));
    Check(kappa::base::IsValidUtf8(text.substr(cut)));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view reference = input.substr(0, split);
  const std::string_view response =
      split == std::string_view::npos ? input : input.substr(split + 1);

  CheckFinalAnswer(response);
  CheckReward(reference, response);
  CheckPythonCode(response);
  CheckUtf8(input);
  return 0;
}
