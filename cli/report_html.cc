#include "cli/report_html.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "cli/report_svg.h"

namespace kappa::cli {
namespace {

constexpr const char* kStyle = R"css(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       margin: 24px; background: #fff; max-width: 1380px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.meta { color: #555; margin: 2px 0 12px; }
.notice { background: #fff6e0; border: 1px solid #f0c36d; padding: 8px 12px; margin: 10px 0; }
.notice ul { margin: 4px 0; padding-left: 20px; }
.charts { display: grid; grid-template-columns: repeat(2, 670px); gap: 8px 10px; }
.wide { margin: 8px 0; }
svg.chart { background: #fff; font: 11px system-ui, sans-serif; display: block; }
svg .chart-title { font-size: 13px; font-weight: 600; fill: #222; }
svg .chart-subtitle { font-size: 11px; fill: #666; }
svg .plot-area { fill: #fafafa; stroke: #bbb; stroke-width: 1; }
svg .grid { stroke: #e4e4e4; stroke-width: 1; }
svg .tick { fill: #555; font-size: 10.5px; }
svg .axis-label { fill: #333; font-size: 11.5px; }
svg .legend-label { fill: #333; font-size: 11px; }
svg .no-data { fill: #999; font-size: 16px; }
svg .event-marker { stroke-width: 1.4; stroke-opacity: 0.7; }
svg .threshold { stroke-width: 1.4; stroke-dasharray: 6 4; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border: 1px solid #ddd; padding: 3px 9px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre.config { background: #f7f7f7; border: 1px solid #ddd; padding: 10px; overflow: auto;
             max-height: 480px; font: 12px/1.35 ui-monospace, Menlo, Consolas, monospace; }
)css";

}  // namespace

std::string HtmlDocument(const std::string& title, const std::string& body) {
  return absl::StrCat("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                      "<meta name=\"generator\" content=\"kappa report\"><title>",
                      XmlEscape(title), "</title><style>", kStyle, "</style></head>\n<body>\n",
                      body, "\n</body></html>\n");
}

std::string AlarmColor(const std::string& kind) {
  if (kind == "magnitude_drowning") return "#d62728";
  if (kind == "directional_conflict") return "#9467bd";
  if (kind == "collapse") return "#ff7f0e";
  return "#7f7f7f";
}

std::string PaletteColor(size_t index) {
  static const char* const kPalette[] = {"#1f77b4", "#e6550d", "#2ca02c", "#8c564b",
                                         "#17becf", "#bcbd22", "#e377c2", "#393b79"};
  return kPalette[index % (sizeof(kPalette) / sizeof(kPalette[0]))];
}

std::string FormatValue(const std::optional<double>& value) {
  if (!value || !std::isfinite(*value)) return "–";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.4g", *value);
  return buffer;
}

std::string FormatSeconds(const std::optional<double>& seconds) {
  if (!seconds || !std::isfinite(*seconds)) return "–";
  const double s = *seconds;
  char buffer[48];
  if (s < 60) {
    std::snprintf(buffer, sizeof(buffer), "%.1f s", s);
  } else if (s < 3600) {
    std::snprintf(buffer, sizeof(buffer), "%d min %02d s", static_cast<int>(s) / 60,
                  static_cast<int>(s) % 60);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%d h %02d min", static_cast<int>(s) / 3600,
                  (static_cast<int>(s) % 3600) / 60);
  }
  return buffer;
}

std::string TableRow(const std::string& key, const std::string& label,
                     const std::vector<std::string>& cells) {
  std::string row = absl::StrCat("<tr data-row=\"", XmlEscape(key), "\"><th>", label, "</th>");
  for (const std::string& cell : cells) absl::StrAppend(&row, "<td class=\"num\">", cell, "</td>");
  return row + "</tr>\n";
}


}  // namespace kappa::cli
