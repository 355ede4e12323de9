// GPT-2's byte-level alphabet (bytes_to_unicode in openai/gpt-2 encoder.py):
// each of the 256 byte values is spelled as one printable code point, so a
// byte-level vocabulary stores byte strings as text. The tokenizer translates
// its vocabulary back to raw bytes once at load and never maps text at encode.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kappa::model::hf {

// The code point that spells `byte`.
char32_t ByteToAlphabet(unsigned char byte);

// Raw bytes of a token spelled in the alphabet, or nullopt when it holds a code
// point outside the alphabet. REQUIRES: token is valid UTF-8.
std::optional<std::string> AlphabetToBytes(std::string_view token);

// The alphabet spelling of raw bytes (the inverse of AlphabetToBytes).
std::string BytesToAlphabet(std::string_view bytes);

}  // namespace kappa::model::hf
