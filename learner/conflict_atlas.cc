#include "learner/conflict_atlas.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

namespace kappa::learner {
namespace {

nlohmann::json ProbabilityOrNull(double logprob) {
  const double p = std::exp(logprob);
  return std::isfinite(p) ? nlohmann::json(p) : nlohmann::json(nullptr);
}

}  // namespace

std::vector<KernelPosition> MostNegativePositions(const torch::Tensor& kernel,
                                                  const torch::Tensor& mask, int64_t count) {
  std::vector<KernelPosition> picks;
  if (count <= 0) return picks;
  const torch::Tensor k = kernel.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const torch::Tensor m = mask.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const auto kv = k.accessor<double, 2>();
  const auto mv = m.accessor<double, 2>();
  for (int64_t b = 0; b < k.size(0); ++b) {
    for (int64_t t = 0; t < k.size(1); ++t) {
      if (mv[b][t] > 0 && kv[b][t] < 0) picks.push_back({b, t, kv[b][t]});
    }
  }
  const size_t keep = std::min(picks.size(), static_cast<size_t>(count));
  std::partial_sort(
      picks.begin(), picks.begin() + keep, picks.end(),
      [](const KernelPosition& a, const KernelPosition& b) { return a.value < b.value; });
  picks.resize(keep);
  return picks;
}

ConflictAtlas::ConflictAtlas(const std::string& path, int64_t positions_per_step,
                             const tasks::Dataset& train, const model::TextTokenizer& tokenizer,
                             const CorruptedSubset* subset)
    : log_(path),
      positions_per_step_(positions_per_step),
      train_(train),
      tokenizer_(tokenizer),
      subset_(subset) {}

std::string ConflictAtlas::TokenText(int64_t id) const {
  return tokenizer_.Decode({id}, /*skip_special_tokens=*/false);
}

nlohmann::json ConflictAtlas::Entry(int64_t step, const TrainBatch& batch,
                                    const KernelPosition& position, size_t example_index) const {
  const int64_t b = position.row, t = position.column;
  // One copy of the row to the host, then plain reads (no per-element sync).
  const torch::Tensor mask_row =
      batch.response_mask[b].to(torch::kCPU, torch::kFloat32).contiguous();
  const torch::Tensor target_row =
      batch.target_tokens[b].to(torch::kCPU, torch::kInt64).contiguous();
  const auto mask = mask_row.accessor<float, 1>();
  const auto targets = target_row.accessor<int64_t, 1>();
  std::vector<int64_t> response;
  int64_t token_index = 0;
  for (int64_t c = 0; c < mask.size(0); ++c) {
    if (mask[c] <= 0) continue;
    if (c < t) ++token_index;
    response.push_back(targets[c]);
  }
  const int64_t token = targets[t];
  nlohmann::json entry = {
      {"step", step},
      {"kdr", position.value},
      {"prompt", train_.at(example_index).prompt},
      {"response", tokenizer_.Decode(response, /*skip_special_tokens=*/true)},
      {"token_index", token_index},
      {"token", TokenText(token)},
      {"student_prob", ProbabilityOrNull(batch.old_logprobs[b][t].item<double>())},
      {"advantage", batch.advantages[b][t].item<double>()},
      {"reward", batch.rewards[b / batch.group_size][b % batch.group_size].item<double>()},
  };
  nlohmann::json teacher_prob = nullptr;
  nlohmann::json teacher_top = nlohmann::json::array();
  if (batch.teacher().defined()) {
    // Hidden rows: the teacher's distribution at this one position, from its head.
    const torch::Tensor row =
        (batch.teacher_hidden.defined() ? batch.teacher_head.LogProbs(batch.teacher_hidden[b][t])
                                        : batch.teacher_logprobs[b][t])
            .to(torch::kCPU, torch::kFloat64);
    if (row.dim() == 0) {  // sampled-token rows: the teacher's log-prob of the token alone
      teacher_prob = ProbabilityOrNull(row.item<double>());
    } else {
      // Full rows are indexed by id; top-k rows carry their ids.
      const torch::Tensor ids = batch.teacher_topk_ids.defined()
                                    ? batch.teacher_topk_ids[b][t].to(torch::kCPU)
                                    : torch::arange(row.size(0), torch::kInt64);
      const int64_t k = std::min<int64_t>(kTeacherTopTokens, row.size(0));
      const auto [values, order] = row.topk(k);
      for (int64_t j = 0; j < k; ++j) {
        teacher_top.push_back({{"token", TokenText(ids[order[j]].item<int64_t>())},
                               {"prob", ProbabilityOrNull(values[j].item<double>())}});
      }
      const torch::Tensor hit = (ids == token).nonzero();
      if (hit.size(0) > 0) teacher_prob = ProbabilityOrNull(row[hit[0][0]].item<double>());
    }
  }
  entry["teacher_prob"] = teacher_prob;
  entry["teacher_top"] = teacher_top;
  if (subset_ != nullptr) {
    entry["subset"] = subset_->TrainCovered(example_index) ? subset_->name()
                                                           : std::string(CorruptedSubset::kRest);
  }
  return entry;
}

std::vector<nlohmann::json> ConflictAtlas::Entries(
    int64_t step, const TrainBatch& batch, const torch::Tensor& kernel,
    const std::vector<size_t>& example_indices) const {
  if (static_cast<size_t>(batch.num_groups) != example_indices.size()) {
    throw std::invalid_argument("ConflictAtlas: one example index per group is required");
  }
  // Samples of a group often share a response; the same (prompt, response,
  // token) then has the same K_DR in every copy and is shown once.
  std::vector<nlohmann::json> entries;
  std::set<std::tuple<size_t, std::string, int64_t>> shown;
  for (const KernelPosition& position :
       MostNegativePositions(kernel, batch.response_mask, std::numeric_limits<int64_t>::max())) {
    if (static_cast<int64_t>(entries.size()) >= positions_per_step_) break;
    const size_t example_index =
        example_indices[static_cast<size_t>(position.row / batch.group_size)];
    nlohmann::json entry = Entry(step, batch, position, example_index);
    if (!shown
             .emplace(example_index, entry["response"].get<std::string>(),
                      entry["token_index"].get<int64_t>())
             .second) {
      continue;
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::Status ConflictAtlas::Record(int64_t step, const TrainBatch& batch,
                                   const torch::Tensor& kernel,
                                   const std::vector<size_t>& example_indices) {
  absl::Status first_failure;
  for (const nlohmann::json& entry : Entries(step, batch, kernel, example_indices)) {
    absl::Status written = log_.Write(entry);
    if (!written.ok() && first_failure.ok()) first_failure = written;
  }
  return first_failure;
}

}  // namespace kappa::learner
