// The few Unicode character classes Python's str methods use, over UTF-8.
// Strings inside the interpreter are UTF-8; Python indexes them by code
// point, so slicing, len() and padding decode first.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/utf8.h"

namespace kappa::tasks::jinja {

// UTF-8 itself is base/utf8.h's (the project's one implementation); Python
// strings are well-formed UTF-8 (checked at the module boundary).
using base::AppendUtf8;
using base::CodePointCount;
using base::DecodeUtf8;
using base::EncodeUtf8;
using base::IsValidUtf8;
using base::NextCodePoint;

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
