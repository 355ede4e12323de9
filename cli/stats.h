// The small-sample statistics `kappa experiment` reports: Student's t
// distribution (CDF and quantile, from the regularized incomplete beta
// function), and the mean of a sample with its t confidence interval and a
// two-sided one-sample t-test against 0 (a paired t-test when the sample is
// of paired differences), and a least-squares line with the t-test of its
// slope. Pure functions, no dependencies beyond <cmath>.
#pragma once

#include <optional>
#include <vector>

namespace kappa::cli {

inline constexpr double kConfidenceLevel = 0.95;  // of every interval the experiment reports

// I_x(a, b) for a, b > 0 and x in [0, 1] (0 below, 1 above): the CDF of
// Beta(a, b) at x, by the continued fraction of Numerical Recipes §6.4.
// Accurate to about 1e-13 relative; NaN for a or b <= 0 or a NaN x.
double RegularizedIncompleteBeta(double a, double b, double x);

// P(T <= t) for T ~ Student t with `df` > 0 degrees of freedom (df may be
// fractional; df = +infinity is the standard normal). NaN for df <= 0.
double StudentTCdf(double t, double df);
// P(|T| >= |t|): the two-sided p-value of a t statistic.
double StudentTTwoSidedP(double t, double df);
// The t with StudentTCdf(t, df) == p, for p in (0, 1): ±infinity at p = 1
// and 0, NaN outside [0, 1] or for df <= 0. E.g. (0.975, 1) = 12.706,
// (0.975, 4) = 2.776, (0.975, +infinity) = 1.960.
double StudentTQuantile(double p, double df);

// A sample's mean and what it says about the population mean.
struct MeanEstimate {
  int n = 0;
  double mean = 0.0;
  double std = 0.0;  // sample standard deviation (divisor n - 1); 0 when n == 1
  // t_{(1+level)/2, n-1} · std / √n, for the interval mean ± half_width.
  // Unset when n < 2 (one value says nothing about its spread).
  std::optional<double> ci_half_width;
  // Two-sided p of the t-test of "the population mean is 0" (n - 1 df);
  // unset when n < 2. With no spread (std 0) it is 0 when mean != 0, else 1.
  std::optional<double> p_value;

  std::optional<double> ci_low() const;
  std::optional<double> ci_high() const;
};

// Unset for an empty sample. `level`: the interval's confidence, in (0, 1).
std::optional<MeanEstimate> EstimateMean(const std::vector<double>& values,
                                         double level = kConfidenceLevel);

// A straight line fitted by least squares, y ≈ intercept + slope · x, and
// what it says about the population slope.
struct LineFit {
  int n = 0;
  double slope = 0.0;
  double intercept = 0.0;
  double slope_standard_error = 0.0;  // √(σ̂² / Σ(x − x̄)²), σ̂² = Σ residual² / (n − 2)
  // t_{(1+level)/2, n−2} · slope_standard_error, for the interval slope ± it.
  double ci_half_width = 0.0;
  // The two-sided t-test of "the slope is 0" (n − 2 df): t = slope / its
  // standard error. An exact fit (no residual) has p 0 when slope != 0.
  double t = 0.0;
  double p_value = 1.0;
  double r_squared = 0.0;  // 1 − Σ residual² / Σ(y − ȳ)²; 1 when y is constant

  double ci_low() const { return slope - ci_half_width; }
  double ci_high() const { return slope + ci_half_width; }
};

// Unset unless x and y have one size n >= 3 (one degree of freedom left for
// the residual spread) and x takes at least two values.
std::optional<LineFit> FitLine(const std::vector<double>& x, const std::vector<double>& y,
                               double level = kConfidenceLevel);

// Holm's step-down adjustment of a family of p-values (in any order, the
// result in the same order): sorted ascending, p_(i) × (m − i + 1) for the
// 1-based rank i, made non-decreasing and capped at 1. Rejecting where the
// adjusted p < α keeps the family-wise error rate at α.
std::vector<double> HolmAdjust(const std::vector<double>& p_values);

// The power of the two-sided one-sample (paired) t-test at level `alpha` with
// `n` >= 2 values whose true mean is `effect` and standard deviation `sd` > 0:
// P(|T| > t_{1-α/2, n-1}) for T noncentral t with n − 1 df and noncentrality
// effect·√n / sd, by integrating the normal tail over the χ² density of
// (n − 1)·s²/σ². NaN outside those bounds.
double PairedTPower(int n, double effect, double sd, double alpha);

}  // namespace kappa::cli
