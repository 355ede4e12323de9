// Plain SVG charts for the HTML reports: line charts (linear or log y, with
// horizontal threshold lines and vertical event markers) and a heatmap with a
// diverging colour scale. No script, no external resources: the page renders
// the same offline, in any browser and in a headless one.
//
// Every coordinate written is finite: non-finite values (and, on a log axis,
// values <= 0) are gaps; a chart with nothing to draw says "no data".
#pragma once

#include <string>
#include <vector>

namespace kappa::cli {

struct ChartSeries {
  std::string name;
  std::string color;  // CSS colour
  std::vector<double> x;
  std::vector<double> y;  // NaN: no value at that x
  bool dashed = false;
  // Draw a dot at each value (for sparse series such as held-out accuracy).
  bool dots = false;
  double opacity = 1.0;
  double width = 1.6;
  bool in_legend = true;
};

struct ChartThreshold {  // a horizontal line
  double y = 0.0;
  std::string label;
  std::string color;
};

struct ChartMarker {  // a vertical line at an x, e.g. an alarm
  double x = 0.0;
  std::string kind;   // data-kind attribute, legend entry
  std::string label;  // tooltip
  std::string color;
};

struct LineChart {
  std::string id;  // data-chart attribute: stable, for tests and CSS
  std::string title;
  std::string subtitle;  // optional, under the title
  std::string x_label = "step";
  std::string y_label;
  bool log_y = false;
  // Fixed y range (both finite, lo < hi) instead of the data's.
  double y_min = 0.0, y_max = 0.0;
  bool fixed_y = false;
  std::vector<ChartSeries> series;
  std::vector<ChartThreshold> thresholds;
  std::vector<ChartMarker> markers;
  int width = 660;
  int height = 300;
};

struct Heatmap {
  std::string id;
  std::string title;
  std::string subtitle;
  std::string x_label = "step";
  std::string y_label;
  std::string value_label;  // what the colour means
  std::vector<double> x;    // one per column (ascending)
  std::vector<std::string> row_labels;     // top to bottom
  std::vector<std::vector<double>> cells;  // [column][row]; NaN: empty cell
  int width = 1340;
  int height = 320;
};

// Segments of a series as polylines: consecutive values are joined unless the
// x distance between them is more than 2.5 times the series' median spacing
// (so a metric measured every k steps is a line, a real hole is a gap).
// Exposed for tests.
std::vector<std::vector<std::pair<double, double>>> Segments(const std::vector<double>& x,
                                                             const std::vector<double>& y,
                                                             bool log_y);

// Tick positions for [lo, hi]: "nice" linear steps, or powers of ten (with
// 2 and 5 between them when the range is under two decades) on a log axis.
std::vector<double> LinearTicks(double lo, double hi, int target);
std::vector<double> LogTicks(double lo, double hi);
// Short tick text: 0.001, 1e-05, 12.5, 3e+04.
std::string TickText(double value);

std::string RenderLineChart(const LineChart& chart);
std::string RenderHeatmap(const Heatmap& heatmap);

// Text for HTML/SVG content and attribute values.
std::string XmlEscape(const std::string& text);

}  // namespace kappa::cli
