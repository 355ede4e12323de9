#include "learner/algo/teacher_head.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

#include "model/autocast_state.h"

namespace kappa::learner {
namespace {

// Rows per block of the row statistics: about 4M logits (16 MB in float32).
constexpr int64_t kBlockElements = int64_t{1} << 22;

torch::ScalarType SoftmaxType(torch::ScalarType weight) {
  return weight == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// fn(log q of a block of flat rows, the block's first row, its row count)
// → [rows] values, one block at a time; the result has hidden's leading shape.
torch::Tensor PerRow(
    const TeacherHead& head, const torch::Tensor& hidden,
    const std::function<torch::Tensor(const torch::Tensor&, int64_t, int64_t)>& fn) {
  const torch::Tensor flat = hidden.reshape({-1, hidden.size(-1)});
  const int64_t rows = flat.size(0);
  const int64_t block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(1, head.vocab()));
  torch::Tensor out =
      torch::empty({rows}, hidden.options().dtype(SoftmaxType(head.weight.scalar_type())));
  for (int64_t start = 0; start < rows; start += block) {
    const int64_t n = std::min(block, rows - start);
    out.narrow(0, start, n).copy_(fn(head.LogProbs(flat.narrow(0, start, n)), start, n));
  }
  return out.view(hidden.sizes().slice(0, hidden.dim() - 1));
}

}  // namespace

torch::Tensor TeacherHead::LogProbs(const torch::Tensor& hidden) const {
  return SoftmaxLogProbs(Logits(hidden));
}

torch::Tensor TeacherHead::Logits(const torch::Tensor& hidden) const {
  if (!defined()) throw std::invalid_argument("TeacherHead: no head weight loaded");
  if (hidden.dim() < 1 || hidden.size(-1) != hidden_size()) {
    throw std::invalid_argument("TeacherHead: hidden rows " + c10::str(hidden.sizes()) +
                                " are not of the head's width " + std::to_string(hidden_size()));
  }
  torch::NoGradGuard no_grad;
  // The teacher's product, whatever autocast the learner's forward runs under.
  const model::AutocastScope no_autocast(weight.device().type(), model::AutocastState{});
  return torch::matmul(hidden.to(weight.device(), weight.scalar_type()), weight.t());
}

torch::Tensor TeacherHead::SoftmaxLogProbs(const torch::Tensor& logits) const {
  torch::NoGradGuard no_grad;
  return torch::log_softmax(logits.to(SoftmaxType(weight.scalar_type())), -1);
}

torch::Tensor TeacherHead::MaxLogProb(const torch::Tensor& hidden) const {
  return PerRow(*this, hidden, [](const torch::Tensor& logq, int64_t, int64_t) {
    return std::get<0>(logq.max(-1));
  });
}

torch::Tensor TeacherHead::TargetLogProbs(const torch::Tensor& hidden,
                                          const torch::Tensor& targets) const {
  if (targets.sizes() != hidden.sizes().slice(0, hidden.dim() - 1)) {
    throw std::invalid_argument("TeacherHead: targets " + c10::str(targets.sizes()) +
                                " do not match hidden rows " + c10::str(hidden.sizes()));
  }
  const torch::Tensor flat_targets = targets.reshape({-1}).to(torch::kInt64);
  return PerRow(*this, hidden, [&](const torch::Tensor& logq, int64_t start, int64_t n) {
    return logq.gather(-1, flat_targets.narrow(0, start, n).to(logq.device()).unsqueeze(-1))
        .squeeze(-1);
  });
}

}  // namespace kappa::learner
