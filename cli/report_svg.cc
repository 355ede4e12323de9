#include "cli/report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace kappa::cli {
namespace {

constexpr int kLeft = 68;
constexpr int kRight = 18;
constexpr int kBottom = 46;
constexpr double kCharWidth = 6.4;  // of the 11px legend font, for layout only

// A coordinate; callers only pass finite values, the guard keeps "nan" out
// of the markup whatever happens upstream.
std::string Num(double v) {
  if (!std::isfinite(v)) v = 0.0;
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", v);
  return buffer;
}

std::string ValueText(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.4g", v);
  return buffer;
}

bool Usable(double y, bool log_y) { return std::isfinite(y) && (!log_y || y > 0); }

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double pixel_lo = 0, pixel_hi = 1;  // pixel of lo, of hi
  double Map(double v) const {
    const double a = log ? std::log10(lo) : lo;
    const double b = log ? std::log10(hi) : hi;
    const double t = ((log ? std::log10(v) : v) - a) / (b - a);
    return pixel_lo + t * (pixel_hi - pixel_lo);
  }
};

// Legend entries laid out left to right, wrapping; returns its height.
struct LegendItem {
  std::string label;
  std::string color;
  bool dashed = false;
  bool marker = false;  // a vertical bar (event kind) rather than a line
};

int LegendHeight(const std::vector<LegendItem>& items, int width) {
  if (items.empty()) return 0;
  double x = kLeft;
  int rows = 1;
  for (const LegendItem& item : items) {
    const double w = 30 + kCharWidth * static_cast<double>(item.label.size()) + 14;
    if (x + w > width - kRight && x > kLeft) {
      ++rows;
      x = kLeft;
    }
    x += w;
  }
  return rows * 16;
}

std::string RenderLegend(const std::vector<LegendItem>& items, int width, int top) {
  if (items.empty()) return "";
  std::string out = "<g class=\"legend\">";
  double x = kLeft;
  double y = top + 11;
  for (const LegendItem& item : items) {
    const double w = 30 + kCharWidth * static_cast<double>(item.label.size()) + 14;
    if (x + w > width - kRight && x > kLeft) {
      x = kLeft;
      y += 16;
    }
    if (item.marker) {
      absl::StrAppend(&out, "<line x1=\"", Num(x + 12), "\" y1=\"", Num(y - 9), "\" x2=\"",
                      Num(x + 12), "\" y2=\"", Num(y + 3), "\" stroke=\"", item.color,
                      "\" stroke-width=\"2\"/>");
    } else {
      absl::StrAppend(&out, "<line x1=\"", Num(x), "\" y1=\"", Num(y - 4), "\" x2=\"",
                      Num(x + 24), "\" y2=\"", Num(y - 4), "\" stroke=\"", item.color,
                      "\" stroke-width=\"2\"", item.dashed ? " stroke-dasharray=\"5 3\"" : "",
                      "/>");
    }
    absl::StrAppend(&out, "<text class=\"legend-label\" x=\"", Num(x + 30), "\" y=\"", Num(y),
                    "\">", XmlEscape(item.label), "</text>");
    x += w;
  }
  return out + "</g>";
}

std::string SvgOpen(const std::string& css_class, const std::string& id, int width, int height,
                    const std::string& title, const std::string& subtitle) {
  std::string out = absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"", css_class, "\" data-chart=\"",
      XmlEscape(id), "\" width=\"", width, "\" height=\"", height, "\" viewBox=\"0 0 ", width, " ",
      height, "\" role=\"img\"><title>", XmlEscape(title), "</title>");
  absl::StrAppend(&out, "<text class=\"chart-title\" x=\"", kLeft, "\" y=\"18\">", XmlEscape(title),
                  "</text>");
  if (!subtitle.empty()) {
    absl::StrAppend(&out, "<text class=\"chart-subtitle\" x=\"", kLeft, "\" y=\"33\">",
                    XmlEscape(subtitle), "</text>");
  }
  return out;
}

int HeaderHeight(const std::string& subtitle) { return subtitle.empty() ? 26 : 40; }

std::string AxisLabels(const std::string& x_label, const std::string& y_label, int width,
                       int height, double plot_top, double plot_bottom) {
  const double mid_y = (plot_top + plot_bottom) / 2;
  return absl::StrCat("<text class=\"axis-label\" x=\"", Num((kLeft + width - kRight) / 2.0),
                      "\" y=\"", height - 6, "\" text-anchor=\"middle\">", XmlEscape(x_label),
                      "</text><text class=\"axis-label\" x=\"14\" y=\"", Num(mid_y),
                      "\" text-anchor=\"middle\" transform=\"rotate(-90 14 ", Num(mid_y), ")\">",
                      XmlEscape(y_label), "</text>");
}

std::string NoData(int width, double plot_top, double plot_bottom) {
  return absl::StrCat("<rect class=\"plot-area\" x=\"", kLeft, "\" y=\"", Num(plot_top),
                      "\" width=\"", width - kLeft - kRight, "\" height=\"",
                      Num(plot_bottom - plot_top), "\"/><text class=\"no-data\" x=\"",
                      Num((kLeft + width - kRight) / 2.0), "\" y=\"",
                      Num((plot_top + plot_bottom) / 2), "\" text-anchor=\"middle\">no data</text>");
}

// Diverging: red for negative (conflict), white at 0, blue for positive.
std::string DivergingColor(double t) {
  t = std::clamp(t, -1.0, 1.0);
  const double a = std::fabs(t);
  const int base[3] = {255, 255, 255};
  const int neg[3] = {178, 24, 43};
  const int pos[3] = {33, 102, 172};
  const int* end = t < 0 ? neg : pos;
  int rgb[3];
  for (int i = 0; i < 3; ++i) {
    rgb[i] = static_cast<int>(std::lround(base[i] + a * (end[i] - base[i])));
  }
  return absl::StrCat("rgb(", rgb[0], ",", rgb[1], ",", rgb[2], ")");
}

}  // namespace

std::string XmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string TickText(double value) {
  if (value == 0) return "0";
  char buffer[32];
  const double a = std::fabs(value);
  if (a >= 1e4 || a < 1e-3) {
    std::snprintf(buffer, sizeof(buffer), "%.0e", value);
    // 1e-05 -> 1e-5, 3e+04 -> 3e4: narrower tick labels.
    std::string s = buffer;
    const size_t e = s.find('e');
    std::string mantissa = s.substr(0, e);
    std::string exponent = s.substr(e + 1);
    const bool negative = exponent[0] == '-';
    exponent.erase(0, 1);
    while (exponent.size() > 1 && exponent[0] == '0') exponent.erase(0, 1);
    return absl::StrCat(mantissa, "e", negative ? "-" : "", exponent);
  }
  std::snprintf(buffer, sizeof(buffer), "%.4g", value);
  return buffer;
}

std::vector<double> LinearTicks(double lo, double hi, int target) {
  std::vector<double> ticks;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return ticks;
  const double raw = (hi - lo) / std::max(1, target);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (raw <= m * magnitude) {
      step = m * magnitude;
      break;
    }
  }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return ticks;
}

std::vector<double> LogTicks(double lo, double hi) {
  std::vector<double> ticks;
  if (!(lo > 0) || !(hi > lo)) return ticks;
  const int a = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
  const int b = static_cast<int>(std::ceil(std::log10(hi) - 1e-9));
  const bool minor = b - a <= 2;
  for (int e = a; e <= b; ++e) {
    const double p = std::pow(10.0, e);
    for (double m : {1.0, 2.0, 5.0}) {
      if (m != 1.0 && !minor) continue;
      const double v = m * p;
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) ticks.push_back(v);
    }
  }
  return ticks;
}

std::vector<std::vector<std::pair<double, double>>> Segments(const std::vector<double>& x,
                                                             const std::vector<double>& y,
                                                             bool log_y) {
  std::vector<std::pair<double, double>> points;
  const size_t n = std::min(x.size(), y.size());
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i]) && Usable(y[i], log_y)) points.emplace_back(x[i], y[i]);
  }
  std::vector<std::vector<std::pair<double, double>>> segments;
  if (points.empty()) return segments;
  std::vector<double> gaps;
  for (size_t i = 1; i < points.size(); ++i) gaps.push_back(points[i].first - points[i - 1].first);
  double limit = 0;
  if (!gaps.empty()) {
    std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
    limit = 2.5 * gaps[gaps.size() / 2];
  }
  segments.push_back({points[0]});
  for (size_t i = 1; i < points.size(); ++i) {
    if (points[i].first - points[i - 1].first > limit) segments.emplace_back();
    segments.back().push_back(points[i]);
  }
  return segments;
}

namespace {

// The plot area of a line chart, in pixels.
struct PlotBox {
  double left = 0, right = 0, top = 0, bottom = 0;
};

// Series, then thresholds, then one entry per alarm kind (first seen first).
std::vector<LegendItem> LineChartLegend(const LineChart& chart) {
  std::vector<LegendItem> legend;
  for (const ChartSeries& s : chart.series) {
    if (s.in_legend) legend.push_back({s.name, s.color, s.dashed, false});
  }
  for (const ChartThreshold& t : chart.thresholds) legend.push_back({t.label, t.color, true, false});
  std::vector<std::string> kinds;
  for (const ChartMarker& m : chart.markers) {
    if (std::find(kinds.begin(), kinds.end(), m.kind) != kinds.end()) continue;
    kinds.push_back(m.kind);
    legend.push_back({absl::StrCat("alarm: ", m.kind), m.color, false, true});
  }
  return legend;
}

struct DataRange {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  size_t drawable = 0;  // values that will be drawn
};

// Data ranges over what will be drawn.
DataRange SeriesRange(const LineChart& chart) {
  DataRange r;
  for (const ChartSeries& s : chart.series) {
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!std::isfinite(s.x[i]) || !Usable(s.y[i], chart.log_y)) continue;
      ++r.drawable;
      r.x_lo = std::min(r.x_lo, s.x[i]);
      r.x_hi = std::max(r.x_hi, s.x[i]);
      r.y_lo = std::min(r.y_lo, s.y[i]);
      r.y_hi = std::max(r.y_hi, s.y[i]);
    }
  }
  return r;
}

// Widens `r` to the markers' x and to the thresholds near the data.
void WidenForMarkersAndThresholds(const LineChart& chart, DataRange* r) {
  for (const ChartMarker& m : chart.markers) {
    if (!std::isfinite(m.x)) continue;
    r->x_lo = std::min(r->x_lo, m.x);
    r->x_hi = std::max(r->x_hi, m.x);
  }
  // A threshold within an order of magnitude (log) or a range (linear) of
  // the data is worth showing: the distance to it is the point.
  for (const ChartThreshold& t : chart.thresholds) {
    if (!Usable(t.y, chart.log_y)) continue;
    const bool near = chart.log_y ? (t.y < r->y_hi * 1e3 && t.y > r->y_lo * 1e-3)
                                  : (t.y < r->y_hi + 3 * (r->y_hi - r->y_lo + 1e-12) &&
                                     t.y > r->y_lo - 3 * (r->y_hi - r->y_lo + 1e-12));
    if (near) {
      r->y_lo = std::min(r->y_lo, t.y);
      r->y_hi = std::max(r->y_hi, t.y);
    }
  }
  if (r->x_hi == r->x_lo) {
    r->x_lo -= 1;
    r->x_hi += 1;
  }
}

struct Scales {
  Axis x;
  Axis y;
  std::vector<double> y_ticks;
};

// The axes over `range`: the fixed y range when the data fits in it, whole
// decades on a log axis, else the data's range padded by 6%.
Scales ChartScales(const LineChart& chart, const DataRange& range, const PlotBox& box) {
  Scales scales;
  scales.x = Axis{range.x_lo, range.x_hi, false, box.left, box.right};
  Axis& ya = scales.y;
  ya.log = chart.log_y;
  ya.pixel_lo = box.bottom;
  ya.pixel_hi = box.top;
  if (chart.fixed_y && !chart.log_y && chart.y_max > chart.y_min && range.y_lo >= chart.y_min &&
      range.y_hi <= chart.y_max) {
    ya.lo = chart.y_min;
    ya.hi = chart.y_max;
    scales.y_ticks = LinearTicks(ya.lo, ya.hi, 5);
  } else if (chart.log_y) {
    ya.lo = std::pow(10.0, std::floor(std::log10(range.y_lo)));
    ya.hi = std::pow(10.0, std::ceil(std::log10(range.y_hi)));
    if (ya.hi <= ya.lo) ya.hi = ya.lo * 10;
    scales.y_ticks = LogTicks(ya.lo, ya.hi);
  } else {
    double pad = (range.y_hi - range.y_lo) * 0.06;
    if (pad <= 0) pad = std::max(std::fabs(range.y_lo) * 0.1, 1e-3);
    ya.lo = range.y_lo - pad;
    ya.hi = range.y_hi + pad;
    scales.y_ticks = LinearTicks(ya.lo, ya.hi, 5);
  }
  return scales;
}

// The plot area's frame, and a grid line with its tick text per tick.
std::string FrameGridAndTicks(const Scales& scales, const PlotBox& box) {
  std::string out =
      absl::StrCat("<rect class=\"plot-area\" x=\"", Num(box.left), "\" y=\"", Num(box.top),
                   "\" width=\"", Num(box.right - box.left), "\" height=\"",
                   Num(box.bottom - box.top), "\"/><g class=\"axes\">");
  for (double v : scales.y_ticks) {
    const double py = scales.y.Map(v);
    absl::StrAppend(&out, "<line class=\"grid\" x1=\"", Num(box.left), "\" y1=\"", Num(py),
                    "\" x2=\"", Num(box.right), "\" y2=\"", Num(py),
                    "\"/><text class=\"tick y-tick\" x=\"", Num(box.left - 5), "\" y=\"",
                    Num(py + 3.5), "\" text-anchor=\"end\">", TickText(v), "</text>");
  }
  for (double v : LinearTicks(scales.x.lo, scales.x.hi, 8)) {
    const double px = scales.x.Map(v);
    absl::StrAppend(&out, "<line class=\"grid\" x1=\"", Num(px), "\" y1=\"", Num(box.top),
                    "\" x2=\"", Num(px), "\" y2=\"", Num(box.bottom),
                    "\"/><text class=\"tick x-tick\" x=\"", Num(px), "\" y=\"",
                    Num(box.bottom + 14), "\" text-anchor=\"middle\">", TickText(v), "</text>");
  }
  return out + "</g>";
}

// A vertical line per event marker (alarm), its label as tooltip.
std::string EventMarkers(const std::vector<ChartMarker>& markers, const Axis& xa,
                         const PlotBox& box) {
  if (markers.empty()) return "";
  std::string out = "<g class=\"markers\">";
  for (const ChartMarker& m : markers) {
    if (!std::isfinite(m.x)) continue;
    const double px = xa.Map(m.x);
    absl::StrAppend(&out, "<line class=\"event-marker\" data-kind=\"", XmlEscape(m.kind),
                    "\" x1=\"", Num(px), "\" y1=\"", Num(box.top), "\" x2=\"", Num(px), "\" y2=\"",
                    Num(box.bottom), "\" stroke=\"", m.color, "\"><title>", XmlEscape(m.label),
                    "</title></line>");
  }
  return out + "</g>";
}

// A horizontal line per threshold inside the y range.
std::string ThresholdLines(const LineChart& chart, const Axis& ya, const PlotBox& box) {
  std::string out;
  for (const ChartThreshold& t : chart.thresholds) {
    if (!Usable(t.y, chart.log_y) || t.y < ya.lo || t.y > ya.hi) continue;
    const double py = ya.Map(t.y);
    absl::StrAppend(&out, "<line class=\"threshold\" x1=\"", Num(box.left), "\" y1=\"", Num(py),
                    "\" x2=\"", Num(box.right), "\" y2=\"", Num(py), "\" stroke=\"", t.color,
                    "\"><title>", XmlEscape(t.label), " = ", ValueText(t.y), "</title></line>");
  }
  return out;
}

// One series: a path per segment (a dot for a lone value), and with `dots`
// a circle with a tooltip at every value.
std::string SeriesPaths(const ChartSeries& s, bool log_y, const Scales& scales) {
  const Axis& xa = scales.x;
  const Axis& ya = scales.y;
  const auto segments = Segments(s.x, s.y, log_y);
  const std::string style =
      absl::StrCat(" stroke=\"", s.color, "\" stroke-width=\"", Num(s.width), "\"",
                   s.opacity < 1 ? absl::StrCat(" stroke-opacity=\"", s.opacity, "\"") : "",
                   s.dashed ? " stroke-dasharray=\"5 3\"" : "");
  std::string out;
  for (const auto& segment : segments) {
    if (segment.size() == 1 && !s.dots) {
      // A lone value between gaps would vanish as a zero-length path.
      absl::StrAppend(&out, "<circle class=\"series-point\" data-series=\"", XmlEscape(s.name),
                      "\" cx=\"", Num(xa.Map(segment[0].first)), "\" cy=\"",
                      Num(ya.Map(segment[0].second)), "\" r=\"1.8\" fill=\"", s.color, "\"/>");
      continue;
    }
    if (segment.size() < 2) continue;
    std::string d;
    for (size_t i = 0; i < segment.size(); ++i) {
      absl::StrAppend(&d, i == 0 ? "M" : "L", Num(xa.Map(segment[i].first)), " ",
                      Num(ya.Map(segment[i].second)));
    }
    absl::StrAppend(&out, "<path class=\"series-line\" data-series=\"", XmlEscape(s.name),
                    "\" d=\"", d, "\" fill=\"none\"", style, "/>");
  }
  if (s.dots) {
    for (const auto& segment : segments) {
      for (const auto& [x, y] : segment) {
        absl::StrAppend(&out, "<circle class=\"series-dot\" data-series=\"", XmlEscape(s.name),
                        "\" cx=\"", Num(xa.Map(x)), "\" cy=\"", Num(ya.Map(y)),
                        "\" r=\"3\" fill=\"", s.color, "\"><title>", XmlEscape(s.name), " at step ",
                        ValueText(x), ": ", ValueText(y), "</title></circle>");
      }
    }
  }
  return out;
}

}  // namespace

std::string RenderLineChart(const LineChart& chart) {
  const std::vector<LegendItem> legend = LineChartLegend(chart);
  const int header = HeaderHeight(chart.subtitle);
  const int legend_height = LegendHeight(legend, chart.width);
  const int height = chart.height + legend_height;
  PlotBox box;
  box.top = header + legend_height + 8;
  box.bottom = height - kBottom;
  box.left = kLeft;
  box.right = chart.width - kRight;

  std::string out = SvgOpen("chart", chart.id, chart.width, height, chart.title, chart.subtitle);
  absl::StrAppend(&out, RenderLegend(legend, chart.width, header));
  absl::StrAppend(
      &out, AxisLabels(chart.x_label, chart.y_label, chart.width, height, box.top, box.bottom));
  DataRange range = SeriesRange(chart);
  if (range.drawable == 0) {
    absl::StrAppend(&out, NoData(chart.width, box.top, box.bottom), "</svg>");
    return out;
  }
  WidenForMarkersAndThresholds(chart, &range);
  const Scales scales = ChartScales(chart, range, box);
  absl::StrAppend(&out, FrameGridAndTicks(scales, box), EventMarkers(chart.markers, scales.x, box),
                  ThresholdLines(chart, scales.y, box), "<g class=\"series\">");
  for (const ChartSeries& s : chart.series)
    absl::StrAppend(&out, SeriesPaths(s, chart.log_y, scales));
  absl::StrAppend(&out, "</g></svg>");
  return out;
}

std::string RenderHeatmap(const Heatmap& heatmap) {
  const int header = HeaderHeight(heatmap.subtitle);
  constexpr int kScaleWidth = 90;  // the colour scale, right of the plot
  const double plot_top = header + 8;
  const double plot_bottom = heatmap.height - kBottom;
  const double plot_left = kLeft;
  const double plot_right = heatmap.width - kRight - kScaleWidth;
  std::string out = SvgOpen("chart heatmap", heatmap.id, heatmap.width, heatmap.height,
                            heatmap.title, heatmap.subtitle);
  absl::StrAppend(&out, AxisLabels(heatmap.x_label, heatmap.y_label, heatmap.width - kScaleWidth,
                                   heatmap.height, plot_top, plot_bottom));

  size_t rows = heatmap.row_labels.size();
  for (const auto& column : heatmap.cells) rows = std::max(rows, column.size());
  const size_t columns = std::min(heatmap.x.size(), heatmap.cells.size());
  std::vector<double> magnitudes;
  for (size_t c = 0; c < columns; ++c) {
    for (double v : heatmap.cells[c]) {
      if (std::isfinite(v)) magnitudes.push_back(std::fabs(v));
    }
  }
  if (rows == 0 || columns == 0 || magnitudes.empty()) {
    absl::StrAppend(&out, NoData(heatmap.width - kScaleWidth, plot_top, plot_bottom), "</svg>");
    return out;
  }
  // Columns are merged (mean per row) so that each is at least ~2 px wide:
  // a long run stays a readable, bounded-size picture.
  const size_t max_columns = static_cast<size_t>(std::max(1.0, (plot_right - plot_left) / 2));
  const size_t per_bin = (columns + max_columns - 1) / max_columns;
  std::vector<double> bin_x;
  std::vector<std::vector<double>> bins;
  for (size_t start = 0; start < columns; start += per_bin) {
    const size_t end = std::min(columns, start + per_bin);
    std::vector<double> sum(rows, 0.0);
    std::vector<int> count(rows, 0);
    for (size_t c = start; c < end; ++c) {
      for (size_t r = 0; r < heatmap.cells[c].size(); ++r) {
        if (std::isfinite(heatmap.cells[c][r])) {
          sum[r] += heatmap.cells[c][r];
          ++count[r];
        }
      }
    }
    std::vector<double> mean(rows, NAN);
    for (size_t r = 0; r < rows; ++r) {
      if (count[r] > 0) mean[r] = sum[r] / count[r];
    }
    bin_x.push_back(heatmap.x[start]);
    bins.push_back(std::move(mean));
  }
  // The scale ends at the 98th percentile of |K|, so one outlier step does
  // not wash out every other cell; beyond it colours saturate.
  std::sort(magnitudes.begin(), magnitudes.end());
  double scale = magnitudes[std::min(magnitudes.size() - 1,
                                     static_cast<size_t>(0.98 * magnitudes.size()))];
  if (!(scale > 0)) scale = magnitudes.back() > 0 ? magnitudes.back() : 1.0;

  const double cell_w = (plot_right - plot_left) / static_cast<double>(bins.size());
  const double cell_h = (plot_bottom - plot_top) / static_cast<double>(rows);
  absl::StrAppend(&out, "<rect class=\"plot-area\" x=\"", Num(plot_left), "\" y=\"",
                  Num(plot_top), "\" width=\"", Num(plot_right - plot_left), "\" height=\"",
                  Num(plot_bottom - plot_top), "\"/><g class=\"cells\">");
  for (size_t b = 0; b < bins.size(); ++b) {
    for (size_t r = 0; r < rows; ++r) {
      const double v = bins[b][r];
      if (!std::isfinite(v)) continue;  // the plot area's background shows: no value
      const std::string row_name =
          r < heatmap.row_labels.size() ? heatmap.row_labels[r] : absl::StrCat(r);
      absl::StrAppend(&out, "<rect class=\"heat-cell\" x=\"", Num(plot_left + b * cell_w),
                      "\" y=\"", Num(plot_top + r * cell_h), "\" width=\"",
                      Num(cell_w + 0.6), "\" height=\"", Num(cell_h + 0.6), "\" fill=\"",
                      DivergingColor(v / scale), "\"><title>step ", ValueText(bin_x[b]),
                      per_bin > 1 ? absl::StrCat(" (+", per_bin - 1, " steps)") : "", ", ",
                      XmlEscape(row_name), ": ", ValueText(v), "</title></rect>");
    }
  }
  absl::StrAppend(&out, "</g><g class=\"axes\">");
  const size_t label_every = std::max<size_t>(1, (rows + 9) / 10);
  for (size_t r = 0; r < rows; r += label_every) {
    const std::string row_name =
        r < heatmap.row_labels.size() ? heatmap.row_labels[r] : absl::StrCat(r);
    absl::StrAppend(&out, "<text class=\"tick y-tick\" x=\"", Num(plot_left - 5), "\" y=\"",
                    Num(plot_top + (r + 0.5) * cell_h + 3.5), "\" text-anchor=\"end\">",
                    XmlEscape(row_name), "</text>");
  }
  const size_t x_every = std::max<size_t>(1, bins.size() / 8);
  for (size_t b = 0; b < bins.size(); b += x_every) {
    const double px = plot_left + (b + 0.5) * cell_w;
    absl::StrAppend(&out, "<text class=\"tick x-tick\" x=\"", Num(px), "\" y=\"",
                    Num(plot_bottom + 14), "\" text-anchor=\"middle\">", TickText(bin_x[b]),
                    "</text>");
  }
  absl::StrAppend(&out, "</g>");

  // Colour scale: -scale at the bottom, 0 in the middle, +scale on top.
  const double sx = plot_right + 28;
  const double sw = 16;
  constexpr int kSteps = 21;
  const double sh = (plot_bottom - plot_top) / kSteps;
  absl::StrAppend(&out, "<g class=\"color-scale\">");
  for (int i = 0; i < kSteps; ++i) {
    const double t = 1.0 - 2.0 * i / (kSteps - 1);
    absl::StrAppend(&out, "<rect class=\"scale-cell\" x=\"", Num(sx), "\" y=\"",
                    Num(plot_top + i * sh), "\" width=\"", Num(sw), "\" height=\"",
                    Num(sh + 0.6), "\" fill=\"", DivergingColor(t), "\"/>");
  }
  const double scale_ticks[] = {scale, 0.0, -scale};
  for (int i = 0; i < 3; ++i) {
    const double py = plot_top + (i * (kSteps - 1) / 2.0 + 0.5) * sh;
    absl::StrAppend(&out, "<text class=\"tick scale-tick\" x=\"", Num(sx + sw + 4), "\" y=\"",
                    Num(py + 3.5), "\">", i == 0 ? "≥" : i == 2 ? "≤" : "",
                    TickText(scale_ticks[i]), "</text>");
  }
  const double mid = (plot_top + plot_bottom) / 2;
  absl::StrAppend(&out, "<text class=\"axis-label\" x=\"", Num(sx - 8), "\" y=\"", Num(mid),
                  "\" text-anchor=\"middle\" transform=\"rotate(-90 ", Num(sx - 8), " ", Num(mid),
                  ")\">", XmlEscape(heatmap.value_label), "</text></g></svg>");
  return out;
}

}  // namespace kappa::cli
