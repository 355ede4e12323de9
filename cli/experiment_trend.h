// The single pre-registered test across arms that an experiment file's
// `trend:` names (TrendSpec): every run of the named arms that finished ok is
// one point (x = its `against` number, log10 of it when asked, y = its
// `metric` number), and a least-squares line through the points gives the
// slope with its 95 % interval and the t-test of "the slope is 0" (n − 2 df).
// It is one test, so its p is not adjusted. No processes, no libtorch.
//
// Written by `kappa experiment` as trend.csv (the points) and a section of
// results.md (the fit).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cli/ablation_spec.h"
#include "cli/experiment_results.h"
#include "cli/stats.h"

namespace kappa::cli {

struct TrendPoint {
  std::string run;  // RunResult::name
  std::string arm;
  double x = 0.0;  // log10 already applied when the spec asks for it
  double y = 0.0;
};

struct TrendResult {
  TrendSpec spec;
  std::vector<TrendPoint> points;  // in `runs` order
  // Runs of the arms that are not points, each "run: why" (did not finish,
  // lacks a number, x <= 0 under log10).
  std::vector<std::string> left_out;
  // Unset below three points or when every x is equal.
  std::optional<LineFit> fit;
  // Set when metric or against names no results.csv column; then there are
  // no points.
  std::string error;
};

// REQUIRES: `metrics` is ComparedMetrics(runs).
TrendResult FitTrend(const TrendSpec& spec, const std::vector<RunResult>& runs,
                     const std::vector<ComparedMetric>& metrics);

// run,arm,x,y: one row per point; the header names x and y by their columns
// (e.g. "log10(kappa_effective_median)").
std::string TrendCsv(const TrendResult& trend);
// "## Trend" with the fit (slope [95 % CI], t, df, p, R², n), the points
// left out, and one row per point.
std::string TrendMarkdown(const TrendResult& trend);

}  // namespace kappa::cli
