// tokenizer.json "pre_tokenizer": splits a normalized piece of text into the
// words BPE sees. Implemented: Split (a String or Regex pattern, every
// behavior, invert), ByteLevel (GPT-2's byte alphabet, optional GPT-2 regex
// and prefix space), Sequence. Any other type is refused at load.
//
// ByteLevel does not map bytes to its printable alphabet here: it must be the
// last step, and the tokenizer then runs BPE over raw bytes with a vocabulary
// translated once at load (byte_level.h), which is equivalent and cheaper.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/hf_tokenizer/json_path.h"

namespace kappa::model::hf {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by the pieces it splits into (in order, none empty).
  // REQUIRES: every piece is valid UTF-8.
  virtual void Split(std::vector<std::string>* pieces) const = 0;
};

struct PreTokenizerSpec {
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // nullptr: the text is one word
  // The pipeline ends with ByteLevel: BPE runs over the pieces' raw bytes.
  bool byte_level = false;
};

// Throws std::invalid_argument naming the JSON path of an unimplemented type,
// a malformed field, or a ByteLevel that is not the last step.
PreTokenizerSpec PreTokenizerFromJson(const JsonNode& node);

}  // namespace kappa::model::hf
