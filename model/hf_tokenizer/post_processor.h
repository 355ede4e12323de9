// tokenizer.json "post_processor": the special tokens that encode adds around
// a single sequence when asked to (add_special_tokens), e.g. Llama 2's <s>.
// Implemented: TemplateProcessing (single sequences), ByteLevel (no change to
// ids), Sequence. Other types are refused at load.
#pragma once

#include <cstdint>
#include <vector>

#include "model/hf_tokenizer/json_path.h"

namespace kappa::model::hf {

class PostProcessor {
 public:
  PostProcessor() = default;  // adds nothing
  // Throws std::invalid_argument naming the JSON path of what it refuses.
  static PostProcessor FromJson(const JsonNode& node);

  // The ids with the template's special tokens around them.
  std::vector<int64_t> AddSpecialTokens(const std::vector<int64_t>& ids) const;

 private:
  // The single-sequence template: ids to emit, with the sequence at -1.
  std::vector<int64_t> single_template_ = {-1};
};

}  // namespace kappa::model::hf
