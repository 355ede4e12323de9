#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {
namespace {

struct Range {
  char32_t first;
  char32_t last;
};

template <size_t N>
bool InRanges(char32_t c, const Range (&ranges)[N]) {
  for (const Range& range : ranges) {
    if (c >= range.first && c <= range.last) return true;
  }
  return false;
}

// Non-ASCII code points str.isprintable() rejects: the Cc, Cf, Zs, Zl, Zp,
// Co blocks (and the noncharacters U+FFFE/U+FFFF).
constexpr Range kNonPrintable[] = {
    {0x0080, 0x00A0},   {0x00AD, 0x00AD},   {0x0600, 0x0605},   {0x061C, 0x061C},
    {0x06DD, 0x06DD},   {0x070F, 0x070F},   {0x0890, 0x0891},   {0x08E2, 0x08E2},
    {0x1680, 0x1680},   {0x180E, 0x180E},   {0x2000, 0x200F},   {0x2028, 0x202F},
    {0x205F, 0x206F},   {0x3000, 0x3000},   {0xD800, 0xF8FF},   {0xFEFF, 0xFEFF},
    {0xFFF9, 0xFFFB},   {0xFFFE, 0xFFFF},   {0x110BD, 0x110BD}, {0x110CD, 0x110CD},
    {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0001, 0xE0001},
    {0xE0020, 0xE007F}, {0xF0000, 0x10FFFF},
};

// Blocks without case mappings or cased letters.
constexpr Range kUncased[] = {
    {0x2000, 0x206F},    // General Punctuation (incl. ZWJ, smart quotes)
    {0x2190, 0x245F},    // Arrows .. Control Pictures, OCR
    {0x2500, 0x2BFF},    // Box Drawing, Block Elements (U+2581), Shapes, Dingbats
    {0x2E80, 0x2FDF},    // CJK Radicals, Kangxi Radicals
    {0x3000, 0x303F},    // CJK Symbols and Punctuation
    {0x3040, 0x30FF},    // Hiragana, Katakana
    {0x3100, 0x312F},    // Bopomofo
    {0x3130, 0x318F},    // Hangul Compatibility Jamo
    {0x31F0, 0x31FF},    // Katakana Phonetic Extensions
    {0x3400, 0x4DBF},    // CJK Extension A
    {0x4E00, 0x9FFF},    // CJK Unified Ideographs
    {0xAC00, 0xD7A3},    // Hangul Syllables
    {0xF900, 0xFAFF},    // CJK Compatibility Ideographs
    {0xFE00, 0xFE0F},    // Variation Selectors
    {0xFE30, 0xFE4F},    // CJK Compatibility Forms
    {0xFF01, 0xFF20},    // Fullwidth punctuation and digits
    {0xFF3B, 0xFF40},    // Fullwidth [ \ ] ^ _ `
    {0xFF5B, 0xFFEF},    // Fullwidth { | } ~ (incl. U+FF5C), halfwidth forms
    {0x1F300, 0x1FAFF},  // Emoji and pictographs
    {0x20000, 0x2FFFF},  // CJK Extensions B..
};

}  // namespace

bool IsPythonSpace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsPythonPrintable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  return !InRanges(c, kNonPrintable);
}

bool IsKnownUncased(char32_t c) { return c >= 0x80 && InRanges(c, kUncased); }

}  // namespace kappa::tasks::jinja
