// UTF-8 as the Hugging Face tokenizers see it: code points of valid text, and
// bytes -> text with U+FFFD replacement the way Rust's String::from_utf8_lossy
// and the WHATWG TextDecoder do it (one U+FFFD per maximal invalid subpart), so
// a model's invalid output decodes like the reference decodes it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kappa::model::hf {

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629:
// no overlong forms, surrogates or values above U+10FFFF), or npos.
size_t FirstInvalidUtf8(std::string_view text);

// Decodes the code point starting at text[*offset] and advances *offset.
// REQUIRES: text is valid UTF-8 and *offset < text.size() is a boundary.
char32_t NextCodePoint(std::string_view text, size_t* offset);

void AppendUtf8(char32_t code_point, std::string* out);

// `bytes` as UTF-8 with every maximal invalid subpart replaced by U+FFFD.
std::string LossyUtf8(std::string_view bytes);

// Unicode White_Space (what Rust's char::is_whitespace and the tokenizers'
// regex `\s` match).
bool IsUnicodeWhitespace(char32_t c);

}  // namespace kappa::model::hf
