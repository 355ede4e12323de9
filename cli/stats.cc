#include "cli/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kappa::cli {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The continued fraction of I_x(a, b) (Numerical Recipes' betacf, modified
// Lentz), which converges fast for x < (a + 1) / (a + b + 2).
double IncompleteBetaFraction(double a, double b, double x) {
  constexpr int kMaxIterations = 1000;
  constexpr double kEpsilon = 1e-15;
  constexpr double kTiny = 1e-300;
  const double qab = a + b;
  const double qap = a + 1.0;
  const double qam = a - 1.0;
  double c = 1.0;
  double d = 1.0 - qab * x / qap;
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1.0 / d;
  double h = d;
  for (int m = 1; m <= kMaxIterations; ++m) {
    const double m2 = 2.0 * m;
    // The even step.
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1.0 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1.0 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    h *= d * c;
    // The odd step.
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1.0 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1.0 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < kEpsilon) break;
  }
  return h;
}

// I_x(a, b) given x and its complement y = 1 - x separately, so that an x
// near 1 (the t CDF at large df) loses no digits.
double IncompleteBeta(double a, double b, double x, double y) {
  if (!(a > 0.0) || !(b > 0.0) || std::isnan(x) || std::isnan(y)) return kNaN;
  if (x <= 0.0) return 0.0;
  if (y <= 0.0) return 1.0;
  // x^a y^b / B(a, b), in logs.
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                a * std::log(x) + b * std::log(y));
  if (x < (a + 1.0) / (a + b + 2.0)) return front * IncompleteBetaFraction(a, b, x) / a;
  return 1.0 - front * IncompleteBetaFraction(b, a, y) / b;
}

double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

}  // namespace

double RegularizedIncompleteBeta(double a, double b, double x) {
  return IncompleteBeta(a, b, x, 1.0 - x);
}

double StudentTTwoSidedP(double t, double df) {
  if (!(df > 0.0) || std::isnan(t)) return kNaN;
  if (std::isinf(df)) return 2.0 * NormalCdf(-std::fabs(t));
  if (std::isinf(t)) return 0.0;
  // P(|T| >= |t|) = I_{df/(df+t²)}(df/2, 1/2).
  const double t2 = t * t;
  return IncompleteBeta(0.5 * df, 0.5, df / (df + t2), t2 / (df + t2));
}

double StudentTCdf(double t, double df) {
  const double two_sided = StudentTTwoSidedP(t, df);
  if (std::isnan(two_sided)) return kNaN;
  return t >= 0.0 ? 1.0 - 0.5 * two_sided : 0.5 * two_sided;
}

double StudentTQuantile(double p, double df) {
  if (!(df > 0.0) || !(p >= 0.0 && p <= 1.0)) return kNaN;
  if (p == 0.0) return -kInfinity;
  if (p == 1.0) return kInfinity;
  if (p == 0.5) return 0.0;
  if (p < 0.5) return -StudentTQuantile(1.0 - p, df);
  // Bisection on the (monotone) CDF: slower than Newton, but it cannot
  // diverge, and the experiment asks for a handful of quantiles.
  double low = 0.0;
  double high = 1.0;
  while (StudentTCdf(high, df) < p) {
    low = high;
    high *= 2.0;
    if (std::isinf(high)) return kInfinity;
  }
  for (int i = 0; i < 200 && high - low > 1e-13 * high; ++i) {
    const double middle = 0.5 * (low + high);
    if (StudentTCdf(middle, df) < p) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return 0.5 * (low + high);
}

std::optional<double> MeanEstimate::ci_low() const {
  if (!ci_half_width) return std::nullopt;
  return mean - *ci_half_width;
}

std::optional<double> MeanEstimate::ci_high() const {
  if (!ci_half_width) return std::nullopt;
  return mean + *ci_half_width;
}

std::vector<double> HolmAdjust(const std::vector<double>& p_values) {
  const size_t m = p_values.size();
  std::vector<size_t> order(m);
  for (size_t i = 0; i < m; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return p_values[a] < p_values[b]; });
  std::vector<double> adjusted(m);
  double running = 0.0;
  for (size_t rank = 0; rank < m; ++rank) {
    const double scaled = p_values[order[rank]] * static_cast<double>(m - rank);
    running = std::min(1.0, std::max(running, scaled));
    adjusted[order[rank]] = running;
  }
  return adjusted;
}

double PairedTPower(int n, double effect, double sd, double alpha) {
  if (n < 2 || !(sd > 0) || !(alpha > 0 && alpha < 1) || !std::isfinite(effect)) {
    return std::nan("");
  }
  const double df = n - 1;
  const double critical = StudentTQuantile(1.0 - 0.5 * alpha, df);
  const double noncentrality = effect * std::sqrt(static_cast<double>(n)) / sd;
  auto normal_cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  // T = (Z + δ) / √(V / df), V ~ χ²_df: P(|T| > c) = E_V[Φ(−c s + δ) + Φ(−c s − δ)],
  // s = √(V / df). Over u = √V (density 2u·f(u²), finite at 0 for every
  // df ≥ 1), by Simpson's rule on [0, √(mean + 40 sd + 50)].
  const double upper = std::sqrt(df + 40.0 * std::sqrt(2.0 * df) + 50.0);
  const int intervals = 20000;  // even
  const double h = upper / intervals;
  const double log_norm = 0.5 * df * std::log(2.0) + std::lgamma(0.5 * df);
  auto integrand = [&](double u) {
    const double density = u > 0.0
                               ? 2.0 * std::exp((df - 1.0) * std::log(u) - 0.5 * u * u - log_norm)
                               : (df == 1.0 ? 2.0 * std::exp(-log_norm) : 0.0);
    const double s = u / std::sqrt(df);
    return density *
           (normal_cdf(-critical * s + noncentrality) + normal_cdf(-critical * s - noncentrality));
  };
  double sum = integrand(0.0) + integrand(upper);
  for (int i = 1; i < intervals; ++i) sum += (i % 2 == 1 ? 4.0 : 2.0) * integrand(i * h);
  return std::min(1.0, sum * h / 3.0);
}

std::optional<MeanEstimate> EstimateMean(const std::vector<double>& values, double level) {
  if (values.empty()) return std::nullopt;
  MeanEstimate estimate;
  estimate.n = static_cast<int>(values.size());
  double sum = 0.0;
  for (double v : values) sum += v;
  estimate.mean = sum / estimate.n;
  if (estimate.n < 2) return estimate;

  double squares = 0.0;
  for (double v : values) squares += (v - estimate.mean) * (v - estimate.mean);
  estimate.std = std::sqrt(squares / (estimate.n - 1));
  const double df = estimate.n - 1;
  const double standard_error = estimate.std / std::sqrt(static_cast<double>(estimate.n));
  estimate.ci_half_width = StudentTQuantile(0.5 * (1.0 + level), df) * standard_error;
  if (standard_error > 0.0) {
    estimate.p_value = StudentTTwoSidedP(estimate.mean / standard_error, df);
  } else {
    estimate.p_value = estimate.mean != 0.0 ? 0.0 : 1.0;
  }
  return estimate;
}

std::optional<LineFit> FitLine(const std::vector<double>& x, const std::vector<double>& y,
                               double level) {
  if (x.size() != y.size() || x.size() < 3) return std::nullopt;
  const double n = static_cast<double>(x.size());
  double x_mean = 0.0;
  double y_mean = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    x_mean += x[i] / n;
    y_mean += y[i] / n;
  }
  double sxx = 0.0;
  double sxy = 0.0;
  double syy = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - x_mean) * (x[i] - x_mean);
    sxy += (x[i] - x_mean) * (y[i] - y_mean);
    syy += (y[i] - y_mean) * (y[i] - y_mean);
  }
  if (!(sxx > 0.0)) return std::nullopt;

  LineFit fit;
  fit.n = static_cast<int>(x.size());
  fit.slope = sxy / sxx;
  fit.intercept = y_mean - fit.slope * x_mean;
  double residual_squares = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double residual = y[i] - (fit.intercept + fit.slope * x[i]);
    residual_squares += residual * residual;
  }
  const double df = n - 2.0;
  fit.slope_standard_error = std::sqrt(residual_squares / df / sxx);
  fit.ci_half_width = StudentTQuantile(0.5 * (1.0 + level), df) * fit.slope_standard_error;
  if (fit.slope_standard_error > 0.0) {
    fit.t = fit.slope / fit.slope_standard_error;
    fit.p_value = StudentTTwoSidedP(fit.t, df);
  } else {
    fit.t = fit.slope == 0.0 ? 0.0 : std::copysign(kInfinity, fit.slope);
    fit.p_value = fit.slope != 0.0 ? 0.0 : 1.0;
  }
  fit.r_squared = syy > 0.0 ? 1.0 - residual_squares / syy : 1.0;
  return fit;
}

}  // namespace kappa::cli
