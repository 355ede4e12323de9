// tokenizer.json "decoder": turns the tokens of a sequence of ids back into
// text (Hugging Face tokenizers' decode_chain; transformers.js's decoders).
// Implemented: ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence. Other
// types are refused at load.
//
// Tokens arrive in the model's spelling: raw bytes for a byte-level model (see
// pre_tokenizer.h), so ByteLevel only joins them and decodes the bytes as
// UTF-8, one U+FFFD per maximal invalid subpart (TextDecoder, from_utf8_lossy).
// ByteFallback turns a run of <0xXX> tokens into its bytes decoded the same way.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/hf_tokenizer/json_path.h"

namespace kappa::model::hf {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token list (a step may join tokens or change each).
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// nullptr for JSON null (tokens are then joined with spaces, as HF does).
// Throws std::invalid_argument naming the JSON path of what it refuses.
std::unique_ptr<Decoder> DecoderFromJson(const JsonNode& node);

}  // namespace kappa::model::hf
