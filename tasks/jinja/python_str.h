// Python's str methods on UTF-8 text, by code point as Python counts.
// Case conversions cover ASCII and the uncased scripts of unicode.h; any
// other letter is an Unsupported error rather than a guessed mapping.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kappa::tasks::jinja {

enum class StripSide { kBoth, kLeft, kRight };
// str.strip/lstrip/rstrip: Unicode whitespace, or any code point of `chars`.
std::string Strip(std::string_view text, const std::optional<std::string>& chars, StripSide side);

// str.split(sep, maxsplit) / str.rsplit; sep nullopt splits on runs of
// whitespace. maxsplit < 0: no limit. ValueError for an empty separator.
std::vector<std::string> Split(std::string_view text, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> RSplit(std::string_view text, const std::optional<std::string>& sep,
                                int64_t maxsplit);

// str.splitlines(keepends).
std::vector<std::string> SplitLines(std::string_view text, bool keepends);

// str.replace(old, new, count); count < 0: all.
std::string Replace(std::string_view text, std::string_view old, std::string_view replacement,
                    int64_t count);

// str.find / str.rfind: the code point index, or -1.
int64_t Find(std::string_view text, std::string_view sub);
int64_t RFind(std::string_view text, std::string_view sub);

// str.count(sub): non-overlapping occurrences.
int64_t Count(std::string_view text, std::string_view sub);

std::string Upper(std::string_view text);
std::string Lower(std::string_view text);
std::string Title(std::string_view text);       // str.title()
std::string Capitalize(std::string_view text);  // str.capitalize()

// str.islower()/isupper(): some cased character and none of the other case.
bool IsLower(std::string_view text);
bool IsUpper(std::string_view text);

enum class Align { kCenter, kLeft, kRight };
// str.center/ljust/rjust(width, fill).
std::string Pad(std::string_view text, int64_t width, std::string_view fill, Align align);

}  // namespace kappa::tasks::jinja
