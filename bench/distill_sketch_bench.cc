// Issue 53's two measurements of the distillation forms a teacher can send
// (docs/algorithms.md §2.2), printed as markdown tables; bench/README.md,
// "The top-k sketch against exact distillation", has the command and the
// results.
//
// (1) The sketch's error. How far topk_tail_reverse_kl (the teacher's top-k
// ids plus one tail bucket) is from the exact full-vocabulary reverse KL
// KL(p‖q), p the student, q the teacher, at a real vocabulary, on teacher
// distributions as peaked as a trained model's. A random model's rows are
// flat, so the teacher's logits are made peaked on purpose: z_t = β_n u_n,
// with u_n a base row and β_n found per position (safeguarded Newton on
// log β) so that the teacher's entropy H(q_n) hits a target. Two base rows:
//   head  u_n = h_n Wᵀ, h_n ~ N(0, I_D), W ~ N(0, 0.02²) [V, D], standardised
//         per row: what an output head of width D produces (Gaussian logits
//         in a D-dimensional subspace; a light tail);
//   zipf  u_n(v) = −log(1 + rank_n(v)), rank_n a random permutation: q ∝
//         rank^(−β), the power-law tail of token frequencies (a heavy tail).
// The student perturbs the teacher's logits: z_s = z_t + σ ε (ε ~ N(0, 1)
// per id, one draw per position shared by every row of the table), or
// z_s = z_t / 1.5 (a flatter student). The kappa side is the learner's own
// code in float32, fed as the teacher server feeds it: teacher log-probs
// log_softmax(z_t) in float32, its top-k values and ids, and the tail log
// q(T) as the float32 logsumexp of the log-probs outside the top k
// (teacher_server/scorer.cc). The exact reference is written here from the
// definition, in float64: KL = Σ p (log p − log q), ∂KL/∂z_s = p ⊙ (log p −
// log q − KL). kappa's full-row code (ReverseKlFromLogProbs, DistillLogitGradient
// with full rows) runs beside it in float32: its columns are the float32
// floor under the sketch's error, and a check of the reference.
//
// (2) Bytes per scored token on the wire: ScoredSequence messages of T
// positions in each form, filled by the one tensor codec and measured with
// ByteSizeLong(), so tags, length prefixes and shapes count.
//
// Usage: distill_sketch_bench [--positions N] [--vocab V] [--hidden D]
//   [--top-k K] [--chunk C] [--tokens T] [--threads P] [--seed S]
// Defaults: 256 positions, V 151,936, D 896, top-64, chunks of 16 positions,
// T 512, 2 threads (on a machine that other jobs share, --threads 1: torch's
// spinning OpenMP threads then cost 4×). Short mode (ctest): --positions 8
// --vocab 4096. Exits 1 if any number it prints is not finite, or if kappa's
// full-row gradient points away from the reference (mean cosine below
// 0.999), which would make the reference suspect.
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "bench/threads.h"
#include "kappa/v1/teacher.pb.h"
#include "learner/algo/logit_gradients.h"
#include "learner/algo/logprob_losses.h"
#include "learner/algo/losses.h"
#include "services/torch_tensor_codec.h"

namespace {

using kappa::learner::DistillLoss;
using kappa::learner::TeacherRows;

struct Options {
  int64_t positions = 256;
  int64_t vocab = 151936;
  int64_t hidden = 896;
  int64_t top_k = 64;
  int64_t chunk = 16;
  int64_t tokens = 512;
  int threads = 2;
  int64_t seed = 53;
};

bool g_all_finite = true;

// Every printed number goes through here.
double Finite(double x) {
  if (!std::isfinite(x)) g_all_finite = false;
  return x;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

enum class Shape { kHead, kZipf };

const char* ShapeName(Shape shape) { return shape == Shape::kHead ? "head" : "zipf"; }

struct Student {
  const char* name;
  double noise;        // σ of z_s = z_t + σ ε, or 0
  double temperature;  // z_s = z_t / temperature
};

const double kTargets[] = {0.1, 0.5, 1.0, 2.0, 4.0};
const Student kStudents[] = {
    {"z_t + 0.5 ε", 0.5, 1.0}, {"z_t + 1.5 ε", 1.5, 1.0}, {"z_t / 1.5", 0.0, 1.5}};
constexpr int kNumTargets = sizeof(kTargets) / sizeof(kTargets[0]);
constexpr int kNumStudents = sizeof(kStudents) / sizeof(kStudents[0]);

// Base logits u [n, V] float32, one row per position, to be scaled by β.
torch::Tensor BaseLogits(Shape shape, const torch::Tensor& weight, int64_t n, int64_t vocab) {
  if (shape == Shape::kHead) {
    const torch::Tensor h = torch::randn({n, weight.size(1)});
    const torch::Tensor u = torch::matmul(h, weight.t());
    return (u - u.mean(-1, /*keepdim=*/true)) / u.std(-1, /*unbiased=*/true, /*keepdim=*/true);
  }
  std::vector<torch::Tensor> rows;
  rows.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows.push_back(torch::randperm(vocab, torch::kFloat32));
  return -torch::stack(rows).log1p();
}

// Σ_v a_v b_v per row of two [n, V] tensors, [n].
torch::Tensor RowDot(const torch::Tensor& a, const torch::Tensor& b) { return (a * b).sum(-1); }

// The Euclidean norm of each row, [n], in one pass.
torch::Tensor RowNorm(const torch::Tensor& a) {
  return at::linalg_vector_norm(a, 2, /*dim=*/{-1}, /*keepdim=*/false, /*dtype=*/c10::nullopt);
}

// β [n] (float64) with H(softmax(β u_n)) = target for every row, to a
// relative 1e-3: Newton on t = log β (dH/dt = −β² Var_p(u)) inside a
// bisection bracket [lower, 1e7] that every step narrows. `lower`: a β [n]
// whose entropy is above the target (the solution for a higher target),
// where the search starts. A row whose target cannot be reached (tied
// maxima) ends at the bracket's edge; the table prints the entropy reached.
torch::Tensor SolveScale(const torch::Tensor& u, double target, const torch::Tensor& lower) {
  const int64_t n = u.size(0);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor lo = lower.log();
  torch::Tensor hi = torch::full({n}, std::log(1e7), f64);
  torch::Tensor t = lo.clone();
  for (int iter = 0; iter < 100; ++iter) {
    const torch::Tensor beta = t.exp();
    const torch::Tensor logp = torch::log_softmax(u * beta.to(torch::kFloat32).unsqueeze(1), -1);
    const torch::Tensor p = logp.exp();
    const torch::Tensor entropy = -(p * logp).sum(-1).to(torch::kFloat64);
    const torch::Tensor mean = (p * u).sum(-1, /*keepdim=*/true);
    const torch::Tensor var = (p * (u - mean).square()).sum(-1).to(torch::kFloat64);
    const torch::Tensor err = entropy - target;
    const torch::Tensor done = err.abs() <= 1e-3 * target;
    if (done.all().item<bool>()) break;
    lo = torch::where(err > 0, t, lo);  // entropy too high: β must grow
    hi = torch::where(err > 0, hi, t);
    const torch::Tensor newton = t + err / (beta.square() * var).clamp_min(1e-300);
    const torch::Tensor inside = (newton > lo) & (newton < hi);
    t = torch::where(done, t, torch::where(inside, newton, (lo + hi) / 2));
  }
  return t.exp();
}

// Per-position cosine of the rows of `exact` (float64, norms given) and
// `other`, and the norm ratio ‖other‖ / ‖exact‖.
struct Agreement {
  torch::Tensor cosine, norm_ratio;
};
Agreement Compare(const torch::Tensor& exact, const torch::Tensor& exact_norm,
                  const torch::Tensor& other) {
  const torch::Tensor o = other.to(torch::kFloat64);
  const torch::Tensor norm = RowNorm(o);
  return {RowDot(exact, o) / (exact_norm * norm), norm / exact_norm};
}

void Append(std::vector<double>& out, const torch::Tensor& values) {
  const torch::Tensor v = values.to(torch::kFloat64).contiguous();
  out.insert(out.end(), v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

// The `fraction` quantile, nearest rank.
double Quantile(std::vector<double> v, double fraction) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(fraction * static_cast<double>(v.size())));
  return v[rank == 0 ? 0 : rank - 1];
}

// One row of table (1): per-position values over the N positions.
struct Row {
  std::vector<double> entropy, q_top, tail, p_top, exact, sketch, full, cos_sketch, cos_full,
      norm_ratio;
};

int SketchTable(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  const Shape shapes[] = {Shape::kHead, Shape::kZipf};
  std::vector<Row> rows(2 * kNumTargets * kNumStudents);
  auto row_at = [&](int s, int t, int c) -> Row& {
    return rows[static_cast<size_t>((s * kNumTargets + t) * kNumStudents + c)];
  };
  const torch::Tensor weight = torch::randn({o.vocab, o.hidden}).mul_(0.02);
  for (int64_t first = 0; first < o.positions; first += o.chunk) {
    const int64_t n = std::min(o.chunk, o.positions - first);
    const torch::Tensor noise = torch::randn({n, o.vocab});
    const torch::Tensor targets = torch::zeros({n}, torch::kInt64);  // unread by these losses
    for (int s = 0; s < 2; ++s) {
      const torch::Tensor u = BaseLogits(shapes[s], weight, n, o.vocab);
      // A zipf row is a permutation of every other: one solve serves all.
      const torch::Tensor solve_rows = shapes[s] == Shape::kZipf ? u.narrow(0, 0, 1) : u;
      torch::Tensor beta = torch::full({solve_rows.size(0)}, 1e-3, torch::kFloat64);
      // The highest target first: its β is where the next search starts.
      for (int t = kNumTargets - 1; t >= 0; --t) {
        beta = SolveScale(solve_rows, kTargets[t], beta);
        // The teacher, as the server computes it: float32 log-probs, top k,
        // and the float32 logsumexp outside the top k.
        const torch::Tensor z_t = u * beta.to(torch::kFloat32).expand({n}).unsqueeze(1);
        const torch::Tensor logq32 = torch::log_softmax(z_t, -1);
        const auto [values, ids] = logq32.topk(o.top_k, -1);
        const torch::Tensor tail =
            logq32.scatter(-1, ids, -std::numeric_limits<float>::infinity()).logsumexp(-1);
        TeacherRows topk_rows;
        topk_rows.logprobs = values;
        topk_rows.topk_ids = ids;
        topk_rows.tail_logmass = tail;
        TeacherRows full_rows;
        full_rows.logprobs = logq32;
        // The reference's teacher: the same float32 logits, in float64.
        const torch::Tensor logq64 = torch::log_softmax(z_t.to(torch::kFloat64), -1);
        const torch::Tensor entropy = -RowDot(logq64.exp(), logq64);
        const torch::Tensor q_top = logq64.gather(-1, ids).exp().sum(-1);
        for (int c = 0; c < kNumStudents; ++c) {
          const Student& student = kStudents[c];
          const torch::Tensor z_s =
              student.noise > 0 ? z_t + noise * student.noise : z_t / student.temperature;
          // Exact, from the definition, float64.
          const torch::Tensor logp64 = torch::log_softmax(z_s.to(torch::kFloat64), -1);
          const torch::Tensor p64 = logp64.exp();
          torch::Tensor grad = logp64 - logq64;  // log p − log q, then the gradient
          const torch::Tensor kl = RowDot(p64, grad);
          grad.sub_(kl.unsqueeze(1)).mul_(p64);  // p ⊙ (log p − log q − KL)
          const torch::Tensor grad_norm = RowNorm(grad);
          // kappa, float32: the sketch and the full rows.
          const torch::Tensor logp32 = torch::log_softmax(z_s, -1);
          const torch::Tensor sketch_kl =
              kappa::learner::TopkTailReverseKl(logp32.gather(-1, ids), values, tail);
          const torch::Tensor sketch_grad = kappa::learner::DistillLogitGradient(
              logp32, topk_rows, targets, DistillLoss::kTopkTailReverseKl, 1.0);
          const torch::Tensor full_kl = kappa::learner::ReverseKlFromLogProbs(logp32, logq32);
          const torch::Tensor full_grad = kappa::learner::DistillLogitGradient(
              logp32, full_rows, targets, DistillLoss::kReverseKl, 1.0);
          Row& row = row_at(s, t, c);
          Append(row.entropy, entropy);
          Append(row.q_top, q_top);
          Append(row.tail, tail);
          Append(row.p_top, p64.gather(-1, ids).sum(-1));
          const Agreement sketch = Compare(grad, grad_norm, sketch_grad);
          Append(row.exact, kl);
          Append(row.sketch, sketch_kl);
          Append(row.full, full_kl);
          Append(row.cos_sketch, sketch.cosine);
          Append(row.norm_ratio, sketch.norm_ratio);
          Append(row.cos_full, Compare(grad, grad_norm, full_grad).cosine);
        }
      }
    }
    std::fprintf(stderr, "positions %lld/%lld, %.1f s\n", static_cast<long long>(first + n),
                 static_cast<long long>(o.positions), Seconds(start));
  }

  std::printf(
      "\n### The sketch's error: top-%lld + tail against the exact reverse KL\n\n"
      "N = %lld positions, V = %lld, D = %lld, seed %lld. Means over positions; "
      "q top-k: the teacher's mass on its top k; log q(T) p50: the median tail log-mass it "
      "sends; rel. error = (sketch − exact) / exact of the means; cos = cosine of the sketch's "
      "logit gradient with the exact one per position (mean, 5th percentile); ‖ĝ‖/‖g‖ = "
      "mean norm ratio. Last two columns: kappa's full-row float32 code against the "
      "float64 reference.\n\n",
      static_cast<long long>(o.top_k), static_cast<long long>(o.positions),
      static_cast<long long>(o.vocab), static_cast<long long>(o.hidden),
      static_cast<long long>(o.seed));
  std::printf(
      "| teacher | H(q) nats | student | q top-%lld | log q(T) p50 | p top-%lld | exact KL | "
      "sketch KL | "
      "rel. error | cos mean | cos p5 | ‖ĝ‖/‖g‖ | full f32 KL err | full f32 cos p5 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      static_cast<long long>(o.top_k), static_cast<long long>(o.top_k));
  double worst_full_cos = 1;
  for (int s = 0; s < 2; ++s) {
    for (int t = 0; t < kNumTargets; ++t) {
      for (int c = 0; c < kNumStudents; ++c) {
        const Row& row = row_at(s, t, c);
        const double exact = Finite(Mean(row.exact));
        const double sketch = Finite(Mean(row.sketch));
        const double full = Finite(Mean(row.full));
        worst_full_cos = std::min(worst_full_cos, Finite(Mean(row.cos_full)));
        std::printf(
            "| %s | %.3f | %s | %.4f | %.4g | %.4f | %.4g | %.4g | %+.2e | %.4f | %.4f | %.3f | "
            "%+.1e | "
            "%.6f |\n",
            ShapeName(shapes[s]), Finite(Mean(row.entropy)), kStudents[c].name,
            Finite(Mean(row.q_top)), Finite(Quantile(row.tail, 0.5)), Finite(Mean(row.p_top)),
            exact, sketch, Finite((sketch - exact) / exact), Finite(Mean(row.cos_sketch)),
            Finite(Quantile(row.cos_sketch, 0.05)), Finite(Mean(row.norm_ratio)),
            Finite((full - exact) / exact), Finite(Quantile(row.cos_full, 0.05)));
      }
    }
  }
  std::printf("\n(%.1f s)\n", Seconds(start));
  if (!(worst_full_cos >= 0.999)) {
    std::fprintf(stderr, "kappa's full-row gradient disagrees with the reference: cos %.6f\n",
                 worst_full_cos);
    return 1;
  }
  return 0;
}

// Bytes of one ScoredSequence per position.
double PerToken(const kappa::v1::ScoredSequence& sequence, int64_t tokens) {
  return static_cast<double>(sequence.ByteSizeLong()) / static_cast<double>(tokens);
}

int WireTable(const Options& o) {
  using kappa::services::EncodeTensor;
  const struct {
    const char* name;
    kappa::v1::DType dtype;
  } dtypes[] = {{"fp32", kappa::v1::DTYPE_FLOAT32}, {"bf16", kappa::v1::DTYPE_BFLOAT16}};
  const int64_t tokens = o.tokens;
  std::printf(
      "\n### Bytes per scored token on the wire\n\n"
      "One ScoredSequence of T = %lld positions, encoded by services::EncodeTensor, "
      "ByteSizeLong() / T.\n\n"
      "| form | values | per position | bytes/token | × full fp32 |\n|---|---|---|---|---|\n",
      static_cast<long long>(tokens));
  double full_fp32 = 0;
  auto print = [&](const std::string& form, const char* dtype, const std::string& holds,
                   double per_token) {
    if (full_fp32 == 0) full_fp32 = per_token;
    std::printf("| %s | %s | %s | %.1f | %.3g |\n", form.c_str(), dtype, holds.c_str(),
                Finite(per_token), Finite(per_token / full_fp32));
  };
  {
    const torch::Tensor logprobs = torch::log_softmax(torch::randn({tokens, o.vocab}), -1);
    for (const auto& d : dtypes) {
      kappa::v1::ScoredSequence sequence;
      EncodeTensor(logprobs, sequence.mutable_logprobs(), d.dtype);
      print("full rows, V = " + std::to_string(o.vocab), d.name,
            std::to_string(o.vocab) + " log-probs", PerToken(sequence, tokens));
    }
    const auto [values, ids] = logprobs.topk(o.top_k, -1);
    const torch::Tensor tail =
        logprobs.scatter(-1, ids, -std::numeric_limits<float>::infinity()).logsumexp(-1);
    for (const auto& d : dtypes) {
      kappa::v1::ScoredSequence sequence;
      EncodeTensor(values, sequence.mutable_logprobs(), d.dtype);
      EncodeTensor(ids.to(torch::kInt32), sequence.mutable_topk_ids());
      EncodeTensor(tail, sequence.mutable_tail_logmass(), kappa::v1::DTYPE_FLOAT32);
      print("top-" + std::to_string(o.top_k) + " + tail", d.name,
            std::to_string(o.top_k) + " log-probs, " + std::to_string(o.top_k) +
                " int32 ids, 1 fp32 tail",
            PerToken(sequence, tokens));
    }
  }
  const struct {
    int64_t width;
    const char* model;
  } teachers[] = {{896, "0.5B"}, {1536, "1.5B"}, {3584, "7B"}};
  for (const auto& teacher : teachers) {
    const torch::Tensor hidden = torch::randn({tokens, teacher.width});
    for (const auto& d : dtypes) {
      kappa::v1::ScoredSequence sequence;
      EncodeTensor(hidden, sequence.mutable_hidden(), d.dtype);
      print("hidden, D = " + std::to_string(teacher.width) + " (" + teacher.model + ")", d.name,
            std::to_string(teacher.width) + " values", PerToken(sequence, tokens));
    }
  }
  return 0;
}

int64_t Positive(const char* flag, const char* value) {
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || parsed < 1) {
    std::fprintf(stderr, "%s wants a positive integer, got '%s'\n", flag, value);
    std::exit(2);
  }
  return parsed;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s wants a value\n", flag.c_str());
      return 2;
    }
    const int64_t value = Positive(argv[i], argv[i + 1]);
    if (flag == "--positions")
      o.positions = value;
    else if (flag == "--vocab")
      o.vocab = value;
    else if (flag == "--hidden")
      o.hidden = value;
    else if (flag == "--top-k")
      o.top_k = value;
    else if (flag == "--chunk")
      o.chunk = value;
    else if (flag == "--tokens")
      o.tokens = value;
    else if (flag == "--threads")
      o.threads = static_cast<int>(value);
    else if (flag == "--seed")
      o.seed = value;
    else {
      std::fprintf(stderr,
                   "unknown flag %s (--positions --vocab --hidden --top-k --chunk --tokens "
                   "--threads --seed)\n",
                   flag.c_str());
      return 2;
    }
  }
  if (o.top_k >= o.vocab) {
    std::fprintf(stderr, "--top-k %lld must be below --vocab %lld\n",
                 static_cast<long long>(o.top_k), static_cast<long long>(o.vocab));
    return 2;
  }
  // Keep freed chunk buffers (≤ 32 MiB each) in the heap: returning them to
  // the kernel and faulting fresh zeroed pages in again cost a third of the
  // run's CPU time.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  kappa::bench::SetBenchThreads(o.threads);
  torch::manual_seed(static_cast<uint64_t>(o.seed));
  const int sketch = SketchTable(o);
  const int wire = WireTable(o);
  if (!g_all_finite) {
    std::fprintf(stderr, "a printed number is not finite\n");
    return 1;
  }
  return sketch != 0 ? sketch : wire;
}
