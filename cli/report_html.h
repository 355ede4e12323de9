// The parts every `kappa report` page shares: the HTML document with its
// inline stylesheet (no network: the page must open from a laptop's disk or
// an air-gapped cluster), colours, number formatting, and the atomic write.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kappa::cli {

// A complete, self-contained HTML5 document around `body` (already HTML).
std::string HtmlDocument(const std::string& title, const std::string& body);

// The colour of an alarm kind (the learner's names; others grey), and the
// i-th colour of the series palette.
std::string AlarmColor(const std::string& kind);
std::string PaletteColor(size_t index);

// "0.512" (4 significant digits) or "–" when unset or not finite.
std::string FormatValue(const std::optional<double>& value);
// "1 h 02 min", "3 min 05 s", "12.3 s"; "–" when unset.
std::string FormatSeconds(const std::optional<double>& seconds);

// A table row: <tr data-row="key"><th>label</th><td>cells...</td></tr>; the
// cells are HTML.
std::string TableRow(const std::string& key, const std::string& label,
                     const std::vector<std::string>& cells);


}  // namespace kappa::cli
