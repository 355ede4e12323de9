// tokenizer.json "normalizer": rewrites each piece of input text between added
// tokens before it is split (Hugging Face tokenizers' normalizers).
// Implemented: NFC, NFD, NFKC, NFKD (utf8proc), Prepend, Replace (String or
// Regex pattern), Strip, Sequence. Any other type is refused at load.
#pragma once

#include <memory>
#include <string>

#include "model/hf_tokenizer/json_path.h"

namespace kappa::model::hf {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // REQUIRES: *text is valid UTF-8; it stays valid UTF-8.
  virtual void Apply(std::string* text) const = 0;
};

// nullptr for a JSON null (no normalizer). Throws std::invalid_argument naming
// the JSON path of an unimplemented type or a malformed field.
std::unique_ptr<Normalizer> NormalizerFromJson(const JsonNode& node);

}  // namespace kappa::model::hf
