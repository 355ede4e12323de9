// UTF-8 and the few Unicode character classes Python's str methods use.
// Strings inside the interpreter are UTF-8; Python indexes them by code
// point, so slicing, len() and padding decode first.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kappa::tasks::jinja {

// True when `text` is well-formed UTF-8 (no overlongs, no surrogates, at most
// U+10FFFF) — what a Python str can hold.
bool IsValidUtf8(std::string_view text);

// Decodes well-formed UTF-8 (checked by the caller at the module boundary).
std::u32string DecodeUtf8(std::string_view text);
std::string EncodeUtf8(std::u32string_view code_points);
void AppendUtf8(char32_t code_point, std::string* out);

// The code point starting at text[*pos]; advances *pos past it.
char32_t NextCodePoint(std::string_view text, size_t* pos);

size_t CodePointCount(std::string_view text);

// str.isspace() for one code point (also what Python's re \s matches).
bool IsPythonSpace(char32_t c);

// Python's str.isprintable() for one code point, for repr(). Exact for
// ASCII and for the non-printable blocks listed in unicode.cc; other
// non-ASCII code points count as printable (Python also escapes unassigned
// ones, which no chat template prints).
bool IsPythonPrintable(char32_t c);

// A non-ASCII code point that Unicode gives no case (CJK, kana, Hangul,
// punctuation, box drawing, emoji, ...): upper()/lower()/title() leave it as
// it is and it separates words for title(). The case conversions refuse
// other non-ASCII code points rather than guess their mapping.
bool IsKnownUncased(char32_t c);

}  // namespace kappa::tasks::jinja
