// UTF-8, the one implementation of the project (the tokenizer, the chat
// template interpreter and the verifier's input checks use it): well-formedness
// as RFC 3629 defines it (no overlong forms, surrogates or values above
// U+10FFFF), code points of valid text, and bytes -> text with U+FFFD
// replacement the way Rust's String::from_utf8_lossy and the WHATWG
// TextDecoder do it (one U+FFFD per maximal invalid subpart), so a model's
// invalid output decodes like the Hugging Face references decode it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kappa::base {

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629:
// no overlong forms, surrogates or values above U+10FFFF), or npos.
size_t FirstInvalidUtf8(std::string_view text);
inline bool IsValidUtf8(std::string_view text) {
  return FirstInvalidUtf8(text) == std::string_view::npos;
}

// Decodes the code point starting at text[*offset] and advances *offset.
// REQUIRES: text is valid UTF-8 and *offset < text.size() is a boundary.
char32_t NextCodePoint(std::string_view text, size_t* offset);

void AppendUtf8(char32_t code_point, std::string* out);

// Code points of valid UTF-8 and back. REQUIRES: valid input.
std::u32string DecodeUtf8(std::string_view text);
std::string EncodeUtf8(std::u32string_view code_points);
size_t CodePointCount(std::string_view text);

// `bytes` as UTF-8 with every maximal invalid subpart replaced by U+FFFD.
std::string LossyUtf8(std::string_view bytes);

// Unicode White_Space (what Rust's char::is_whitespace and the tokenizers'
// regex `\s` match).
bool IsUnicodeWhitespace(char32_t c);

}  // namespace kappa::base
