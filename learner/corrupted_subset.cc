#include "learner/corrupted_subset.h"

#include <torch/torch.h>

#include <algorithm>

namespace kappa::learner {
namespace {

std::vector<bool> Coverage(const tasks::AnswerCorruption& rule, const tasks::Dataset& dataset,
                           size_t count) {
  std::vector<bool> covered(std::min(count, dataset.size()));
  for (size_t i = 0; i < covered.size(); ++i) covered[i] = rule.Covers(dataset.at(i));
  return covered;
}

// The covered ones among the first `count` examples, answered the rule's way.
tasks::VectorDataset CoveredAsTaught(const tasks::AnswerCorruption& rule,
                                     const tasks::Dataset& dataset, size_t count) {
  std::vector<tasks::Example> covered;
  for (size_t i = 0; i < std::min(count, dataset.size()); ++i) {
    if (!rule.Covers(dataset.at(i))) continue;
    tasks::Example example = dataset.at(i);
    example.answer = rule.AnswerFor(example);
    covered.push_back(std::move(example));
  }
  return tasks::VectorDataset(std::move(covered));
}

// Sums over one subset's response positions.
struct KdrSums {
  int64_t positions = 0, negative = 0;
  double total = 0.0;
  std::vector<double> token_total;
  std::vector<int64_t> token_count;

  void Add(int64_t token, double k) {
    ++positions;
    negative += k < 0 ? 1 : 0;
    total += k;
    if (static_cast<size_t>(token) >= token_total.size()) {
      token_total.resize(token + 1, 0.0);
      token_count.resize(token + 1, 0);
    }
    token_total[token] += k;
    ++token_count[token];
  }

  SubsetKdr Summary() const {
    SubsetKdr out;
    out.positions = positions;
    if (positions > 0) {
      out.mean = total / static_cast<double>(positions);
      out.negative_fraction = static_cast<double>(negative) / static_cast<double>(positions);
    }
    for (size_t t = 0; t < token_total.size(); ++t) {
      out.token_mean.push_back(token_count[t] > 0
                                   ? std::optional<double>(token_total[t] / token_count[t])
                                   : std::nullopt);
    }
    return out;
  }
};

}  // namespace

CorruptedSubset::CorruptedSubset(tasks::AnswerCorruption rule, const tasks::Dataset& train,
                                 const tasks::Dataset& heldout, size_t heldout_count)
    : rule_(std::move(rule)),
      train_covered_(Coverage(rule_, train, train.size())),
      heldout_covered_(Coverage(rule_, heldout, heldout_count)),
      covered_heldout_as_taught_(CoveredAsTaught(rule_, heldout, heldout_count)) {}

std::map<std::string, double> CorruptedSubset::AccuracyBySubset(
    const std::vector<bool>& correct) const {
  int64_t right[2] = {0, 0}, total[2] = {0, 0};  // [rest, covered]
  for (size_t i = 0; i < correct.size(); ++i) {
    const int subset = heldout_covered_.at(i) ? 1 : 0;
    ++total[subset];
    right[subset] += correct[i] ? 1 : 0;
  }
  std::map<std::string, double> accuracy;
  if (total[1] > 0) accuracy[name()] = static_cast<double>(right[1]) / total[1];
  if (total[0] > 0) accuracy[kRest] = static_cast<double>(right[0]) / total[0];
  return accuracy;
}

std::map<std::string, SubsetKdr> CorruptedSubset::KdrBySubset(
    const std::string& covered_name, const torch::Tensor& kernel,
    const torch::Tensor& response_mask, const std::vector<bool>& row_covered) {
  const torch::Tensor k = kernel.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const torch::Tensor m = response_mask.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const int64_t rows = k.size(0), length = k.size(1);
  if (static_cast<size_t>(rows) != row_covered.size()) {
    throw std::invalid_argument("KdrBySubset: one coverage flag per kernel row is required");
  }
  const auto kv = k.accessor<double, 2>();
  const auto mv = m.accessor<double, 2>();
  KdrSums sums[2];  // [rest, covered]
  for (int64_t b = 0; b < rows; ++b) {
    int64_t token = 0;  // index of the position within the row's response
    for (int64_t t = 0; t < length; ++t) {
      if (mv[b][t] <= 0) continue;
      sums[row_covered[b] ? 1 : 0].Add(token++, kv[b][t]);
    }
  }
  return {{covered_name, sums[1].Summary()}, {kRest, sums[0].Summary()}};
}

}  // namespace kappa::learner
