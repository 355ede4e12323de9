#include "learner/algo/train_batch.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "learner/algo/losses.h"

namespace kappa::learner {
namespace {

enum class TeacherForm { kNone, kSampled, kFull, kTopk, kHidden };

[[noreturn]] void Fail(size_t group, size_t sample, const std::string& what) {
  throw BadGroupError(group, "BuildTrainBatch: group " + std::to_string(group) + " sample " +
                                 std::to_string(sample) + ": " + what);
}

TeacherForm FormOf(const ScoredSample& s) {
  if (s.teacher_hidden.defined()) {
    return s.teacher_logprobs.defined() ? TeacherForm::kNone : TeacherForm::kHidden;
  }
  if (!s.teacher_logprobs.defined()) return TeacherForm::kNone;
  if (s.teacher_topk_ids.defined()) return TeacherForm::kTopk;
  return s.teacher_logprobs.dim() == 1 ? TeacherForm::kSampled : TeacherForm::kFull;
}

// A top-k row's ids: int64 [T, k] matching its log-probs, distinct per row.
void ValidateTopkIds(const ScoredSample& s, size_t g, size_t i) {
  const torch::Tensor& ids = s.teacher_topk_ids;
  if (ids.scalar_type() != torch::kInt64 || ids.sizes() != s.teacher_logprobs.sizes()) {
    Fail(g, i,
         "teacher_topk_ids " + c10::str(ids.sizes()) + " " +
             std::string(c10::toString(ids.scalar_type())) +
             " must be int64 of the shape of teacher_logprobs " +
             c10::str(s.teacher_logprobs.sizes()));
  }
  if ((ids < 0).any().item<bool>()) Fail(g, i, "negative teacher_topk_ids");
  const torch::Tensor& tail = s.teacher_tail_logmass;
  if (tail.defined() && (tail.dim() != 1 || tail.size(0) != ids.size(0))) {
    Fail(g, i,
         "teacher_tail_logmass " + c10::str(tail.sizes()) + " must be [T] for " +
             std::to_string(ids.size(0)) + " top-k rows");
  }
  const int64_t k = ids.size(1);
  if (k > 1) {
    const torch::Tensor sorted = std::get<0>(ids.sort(1));
    if ((sorted.narrow(1, 1, k - 1) == sorted.narrow(1, 0, k - 1)).any().item<bool>()) {
      Fail(g, i, "teacher_topk_ids repeat an id within a row");
    }
  }
}

// Hidden rows: [T, width] floating point, finite (the width is the first
// sample's; the head's is checked where the batch meets it).
void ValidateHidden(const ScoredSample& s, int64_t width, size_t g, size_t i) {
  const torch::Tensor& h = s.teacher_hidden;
  const int64_t length = static_cast<int64_t>(s.response_tokens.size());
  if (!h.is_floating_point() || h.dim() != 2 || h.size(0) != length || h.size(1) != width) {
    Fail(g, i,
         "teacher_hidden " + c10::str(h.sizes()) + " must be floating [T, D_t] = [" +
             std::to_string(length) + ", " + std::to_string(width) + "]");
  }
  if (!torch::isfinite(h).all().item<bool>()) Fail(g, i, "non-finite teacher_hidden");
}

// Checks every group against the first one and returns (teacher form, V or k
// or D_t).
std::pair<TeacherForm, int64_t> Validate(const std::vector<ScoredGroup>& groups) {
  if (groups.empty()) throw std::invalid_argument("BuildTrainBatch: no groups");
  const size_t group_size = groups[0].samples.size();
  const TeacherForm form = group_size > 0 ? FormOf(groups[0].samples[0]) : TeacherForm::kNone;
  int64_t vocab = 0;  // V of full rows, k of top-k rows
  if (form == TeacherForm::kFull || form == TeacherForm::kTopk) {
    vocab = groups[0].samples[0].teacher_logprobs.size(1);
  }
  if (form == TeacherForm::kHidden && groups[0].samples[0].teacher_hidden.dim() == 2) {
    vocab = groups[0].samples[0].teacher_hidden.size(1);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const ScoredGroup& group = groups[g];
    if (group.samples.empty()) Fail(g, 0, "group has no samples");
    if (group.samples.size() != group_size) {
      Fail(g, 0, "group size " + std::to_string(group.samples.size()) +
                     " differs from the first group's " + std::to_string(group_size));
    }
    if (group.prompt_tokens.empty()) Fail(g, 0, "empty prompt");
    for (int64_t id : group.prompt_tokens) {
      if (id < 0) Fail(g, 0, "negative prompt token id " + std::to_string(id));
    }
    for (size_t i = 0; i < group.samples.size(); ++i) {
      const ScoredSample& s = group.samples[i];
      const int64_t length = static_cast<int64_t>(s.response_tokens.size());
      if (length == 0) Fail(g, i, "empty response");
      for (int64_t id : s.response_tokens) {
        if (id < 0) Fail(g, i, "negative response token id " + std::to_string(id));
      }
      if (s.behavior_logprobs.size() != s.response_tokens.size()) {
        Fail(g, i, "behavior_logprobs has " + std::to_string(s.behavior_logprobs.size()) +
                       " entries for " + std::to_string(length) + " response tokens");
      }
      for (float lp : s.behavior_logprobs) {
        if (!std::isfinite(lp)) Fail(g, i, "non-finite behavior_logprobs");
      }
      if (!std::isfinite(s.reward)) Fail(g, i, "non-finite reward");
      const torch::Tensor& t = s.teacher_logprobs;
      if (FormOf(s) != form || (s.teacher_hidden.defined() && s.teacher_logprobs.defined())) {
        Fail(g, i,
             "teacher_logprobs (or teacher_hidden) must be given for all samples or for none, in "
             "one form");
      }
      if (form == TeacherForm::kHidden) {
        ValidateHidden(s, vocab, g, i);
        continue;
      }
      if (!t.defined()) continue;
      if (!t.is_floating_point()) Fail(g, i, "teacher_logprobs must be floating point");
      if (t.dim() == 0 || t.dim() > 2 || t.size(0) != length) {
        Fail(g, i, "teacher_logprobs shape " + c10::str(t.sizes()) + " does not match " +
                       std::to_string(length) + " response tokens (want [T] or [T, V])");
      }
      if (form == TeacherForm::kFull && t.size(1) != vocab) {
        Fail(g, i, "teacher vocabulary " + std::to_string(t.size(1)) + " differs from " +
                       std::to_string(vocab));
      }
      if (form == TeacherForm::kTopk) {
        if (t.size(1) != vocab) {
          Fail(g, i,
               "teacher top-k rows of k " + std::to_string(t.size(1)) +
                   " differ from the first sample's " + std::to_string(vocab));
        }
        ValidateTopkIds(s, g, i);
        if (s.teacher_tail_logmass.defined() !=
            groups[0].samples[0].teacher_tail_logmass.defined()) {
          Fail(g, i, "teacher_tail_logmass must be given for all top-k samples or for none");
        }
      }
      if (!torch::isfinite(t).all().item<bool>()) Fail(g, i, "non-finite teacher_logprobs");
    }
    for (size_t d = 0; d < group.teacher_demonstrations.size(); ++d) {
      const std::vector<int64_t>& demo = group.teacher_demonstrations[d];
      if (demo.empty()) Fail(g, 0, "demonstration " + std::to_string(d) + " is empty");
      for (int64_t id : demo) {
        if (id < 0) Fail(g, 0, "negative token id in demonstration " + std::to_string(d));
      }
    }
  }
  return {form, vocab};
}

}  // namespace

int64_t TrainBatch::teacher_bytes() const {
  int64_t bytes = 0;
  for (const torch::Tensor* t :
       {&teacher_logprobs, &teacher_topk_ids, &teacher_tail_logmass, &teacher_hidden}) {
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

TrainBatch TrainBatch::To(const torch::Device& device) const {
  auto move = [&](const torch::Tensor& t) { return t.defined() ? t.to(device) : t; };
  TrainBatch out = *this;
  out.input_tokens = move(input_tokens);
  out.attention_mask = move(attention_mask);
  out.target_tokens = move(target_tokens);
  out.response_mask = move(response_mask);
  out.old_logprobs = move(old_logprobs);
  out.advantages = move(advantages);
  out.teacher_logprobs = move(teacher_logprobs);
  out.teacher_topk_ids = move(teacher_topk_ids);
  out.teacher_tail_logmass = move(teacher_tail_logmass);
  out.teacher_hidden = move(teacher_hidden);
  out.teacher_head.weight = move(teacher_head.weight);
  out.rewards = move(rewards);
  out.sft_input_tokens = move(sft_input_tokens);
  out.sft_attention_mask = move(sft_attention_mask);
  out.sft_target_tokens = move(sft_target_tokens);
  out.sft_mask = move(sft_mask);
  return out;
}

TrainBatch TrainBatch::SelectRows(const torch::Tensor& rows) const {
  auto pick = [&](const torch::Tensor& t) {
    return t.defined() ? t.index_select(0, rows.to(t.device())) : t;
  };
  TrainBatch out;
  out.input_tokens = pick(input_tokens);
  out.attention_mask = pick(attention_mask);
  out.target_tokens = pick(target_tokens);
  out.response_mask = pick(response_mask);
  out.old_logprobs = pick(old_logprobs);
  out.advantages = pick(advantages);
  out.teacher_logprobs = pick(teacher_logprobs);
  out.teacher_topk_ids = pick(teacher_topk_ids);
  out.teacher_tail_logmass = pick(teacher_tail_logmass);
  out.teacher_hidden = pick(teacher_hidden);
  out.teacher_head = teacher_head;
  out.group_size = group_size;
  return out;
}

torch::Tensor MicroBatch::Slice(const torch::Tensor& whole_batch_tensor) const {
  if (whole || !whole_batch_tensor.defined()) return whole_batch_tensor;
  return whole_batch_tensor.index_select(0, rows.to(whole_batch_tensor.device()))
      .narrow(1, 0, length);
}

void MicroBatch::Scatter(const torch::Tensor& part, torch::Tensor& whole_batch_tensor) const {
  if (whole) {
    whole_batch_tensor.copy_(part);
    return;
  }
  whole_batch_tensor.narrow(1, 0, length).index_copy_(0, rows.to(part.device()), part);
}

std::vector<MicroBatch> SplitMicroBatches(const TrainBatch& batch, int64_t max_sequences) {
  const int64_t num_rows = batch.input_tokens.size(0);
  if (max_sequences <= 0 || max_sequences >= num_rows) {
    MicroBatch all;
    all.batch = batch;
    all.rows = torch::arange(num_rows, torch::kInt64);
    all.length = batch.input_tokens.size(1);
    all.whole = true;
    return {all};
  }
  // Longest first; a stable sort keeps equal-length rows in batch order.
  const torch::Tensor lengths = batch.attention_mask.sum(1).to(torch::kCPU);
  const torch::Tensor order =
      std::get<1>(lengths.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  std::vector<MicroBatch> out;
  for (int64_t start = 0; start < num_rows; start += max_sequences) {
    MicroBatch micro;
    micro.rows = order.narrow(0, start, std::min(max_sequences, num_rows - start)).contiguous();
    micro.length = lengths.index_select(0, micro.rows).max().item<int64_t>();
    micro.batch = batch.SelectRows(micro.rows);
    for (torch::Tensor* t :
         {&micro.batch.input_tokens, &micro.batch.attention_mask, &micro.batch.target_tokens,
          &micro.batch.response_mask, &micro.batch.old_logprobs, &micro.batch.advantages,
          &micro.batch.teacher_logprobs, &micro.batch.teacher_topk_ids,
          &micro.batch.teacher_tail_logmass, &micro.batch.teacher_hidden}) {
      if (t->defined() && t->dim() >= 2) *t = t->narrow(1, 0, micro.length);
    }
    micro.batch.num_groups = 0;  // rows of several groups: no group structure
    out.push_back(std::move(micro));
  }
  // The SFT rows are few and separate from the sampled ones: with the first.
  TrainBatch& first = out.front().batch;
  first.sft_input_tokens = batch.sft_input_tokens;
  first.sft_attention_mask = batch.sft_attention_mask;
  first.sft_target_tokens = batch.sft_target_tokens;
  first.sft_mask = batch.sft_mask;
  first.num_demonstrations = batch.num_demonstrations;
  return out;
}

namespace {

// Teacher demonstrations as SFT rows: (prompt, response) sequences shifted by
// one, the response tokens as targets.
void AddSftRows(const std::vector<ScoredGroup>& groups, int64_t pad_id, TrainBatch* out) {
  std::vector<std::pair<const std::vector<int64_t>*, const std::vector<int64_t>*>> rows;
  int64_t max_len = 0;
  for (const ScoredGroup& group : groups) {
    for (const std::vector<int64_t>& demo : group.teacher_demonstrations) {
      rows.emplace_back(&group.prompt_tokens, &demo);
      max_len = std::max<int64_t>(max_len, static_cast<int64_t>(group.prompt_tokens.size() +
                                                                 demo.size()) - 1);
    }
  }
  if (rows.empty()) return;
  const int64_t n = static_cast<int64_t>(rows.size());
  out->num_demonstrations = n;
  out->sft_input_tokens = torch::full({n, max_len}, pad_id, torch::kInt64);
  out->sft_target_tokens = torch::full({n, max_len}, pad_id, torch::kInt64);
  out->sft_attention_mask = torch::zeros({n, max_len}, torch::kBool);
  out->sft_mask = torch::zeros({n, max_len}, torch::kFloat32);
  auto input = out->sft_input_tokens.accessor<int64_t, 2>();
  auto target = out->sft_target_tokens.accessor<int64_t, 2>();
  auto attend = out->sft_attention_mask.accessor<bool, 2>();
  auto response = out->sft_mask.accessor<float, 2>();
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<int64_t>& prompt = *rows[static_cast<size_t>(r)].first;
    const std::vector<int64_t>& demo = *rows[static_cast<size_t>(r)].second;
    const int64_t prompt_len = static_cast<int64_t>(prompt.size());
    const int64_t seq_len = prompt_len + static_cast<int64_t>(demo.size());
    auto token_at = [&](int64_t k) { return k < prompt_len ? prompt[k] : demo[k - prompt_len]; };
    for (int64_t t = 0; t + 1 < seq_len; ++t) {
      input[r][t] = token_at(t);
      target[r][t] = token_at(t + 1);
      attend[r][t] = true;
      if (t + 1 >= prompt_len) response[r][t] = 1.0f;
    }
  }
}

}  // namespace

TruncatedResponses ParseTruncatedResponses(const std::string& name) {
  if (name == "keep") return TruncatedResponses::kKeep;
  if (name == "mask") return TruncatedResponses::kMask;
  if (name == "zero_reward") return TruncatedResponses::kZeroReward;
  throw std::invalid_argument("unknown value '" + name + "' (allowed: keep, mask, zero_reward)");
}

TrainBatch BuildTrainBatch(const std::vector<ScoredGroup>& groups, bool norm_std, int64_t pad_id,
                           TruncatedResponses truncated, AdvantageStd advantage_std) {
  const auto [form, vocab] = Validate(groups);
  const int64_t num_groups = static_cast<int64_t>(groups.size());
  const int64_t group_size = static_cast<int64_t>(groups[0].samples.size());
  const int64_t batch = num_groups * group_size;

  int64_t max_len = 0;
  for (const ScoredGroup& group : groups) {
    for (const ScoredSample& s : group.samples) {
      const int64_t seq_len =
          static_cast<int64_t>(group.prompt_tokens.size() + s.response_tokens.size());
      max_len = std::max(max_len, seq_len - 1);
    }
  }

  TrainBatch out;
  out.num_groups = num_groups;
  out.group_size = group_size;
  out.rewards = torch::empty({num_groups, group_size}, torch::kFloat32);
  auto rewards = out.rewards.accessor<float, 2>();
  for (int64_t g = 0; g < num_groups; ++g) {
    for (int64_t i = 0; i < group_size; ++i) {
      const ScoredSample& s = groups[g].samples[i];
      out.num_truncated += s.truncated ? 1 : 0;
      rewards[g][i] = s.truncated && truncated == TruncatedResponses::kZeroReward ? 0.0f : s.reward;
    }
  }
  const torch::Tensor group_adv = GrpoAdvantages(out.rewards, norm_std, advantage_std).contiguous();
  auto adv_of = group_adv.accessor<float, 2>();

  out.input_tokens = torch::full({batch, max_len}, pad_id, torch::kInt64);
  out.target_tokens = torch::full({batch, max_len}, pad_id, torch::kInt64);
  out.attention_mask = torch::zeros({batch, max_len}, torch::kBool);
  out.response_mask = torch::zeros({batch, max_len}, torch::kFloat32);
  out.old_logprobs = torch::zeros({batch, max_len}, torch::kFloat32);
  out.advantages = torch::zeros({batch, max_len}, torch::kFloat32);
  if (form == TeacherForm::kFull) {
    out.teacher_logprobs = torch::zeros({batch, max_len, vocab}, torch::kFloat32);
  } else if (form == TeacherForm::kSampled) {
    out.teacher_logprobs = torch::zeros({batch, max_len}, torch::kFloat32);
  } else if (form == TeacherForm::kHidden) {
    out.teacher_hidden =
        torch::zeros({batch, max_len, vocab}, groups[0].samples[0].teacher_hidden.options());
  } else if (form == TeacherForm::kTopk) {
    // Padding: k distinct ids of probability 1/(k+1) each, finite in every
    // top-k loss and its gradient.
    const int64_t k = vocab;
    out.teacher_logprobs =
        torch::full({batch, max_len, k}, -std::log(static_cast<double>(k + 1)), torch::kFloat32);
    out.teacher_topk_ids = torch::arange(k, torch::kInt64).expand({batch, max_len, k}).contiguous();
    if (groups[0].samples[0].teacher_tail_logmass.defined()) {
      out.teacher_tail_logmass =
          torch::full({batch, max_len}, -std::log(static_cast<double>(k + 1)), torch::kFloat32);
    }
  }
  auto input = out.input_tokens.accessor<int64_t, 2>();
  auto target = out.target_tokens.accessor<int64_t, 2>();
  auto attend = out.attention_mask.accessor<bool, 2>();
  auto response = out.response_mask.accessor<float, 2>();
  auto old_lp = out.old_logprobs.accessor<float, 2>();
  auto adv = out.advantages.accessor<float, 2>();

  for (int64_t g = 0; g < num_groups; ++g) {
    const std::vector<int64_t>& prompt = groups[g].prompt_tokens;
    const int64_t prompt_len = static_cast<int64_t>(prompt.size());
    for (int64_t i = 0; i < group_size; ++i) {
      const ScoredSample& s = groups[g].samples[i];
      const int64_t b = g * group_size + i;
      const int64_t resp_len = static_cast<int64_t>(s.response_tokens.size());
      const int64_t seq_len = prompt_len + resp_len;
      auto token_at = [&](int64_t k) { return k < prompt_len ? prompt[k] : s.response_tokens[k - prompt_len]; };
      for (int64_t t = 0; t + 1 < seq_len; ++t) {
        input[b][t] = token_at(t);
        target[b][t] = token_at(t + 1);
        attend[b][t] = true;
      }
      // Response token k is sequence[prompt_len + k], predicted at position
      // prompt_len - 1 + k. A masked truncated response keeps its data but
      // no position of it counts.
      const int64_t first = prompt_len - 1;
      const float counts = s.truncated && truncated == TruncatedResponses::kMask ? 0.0f : 1.0f;
      for (int64_t k = 0; k < resp_len; ++k) {
        response[b][first + k] = counts;
        old_lp[b][first + k] = s.behavior_logprobs[k];
        adv[b][first + k] = adv_of[g][i];
      }
      if (form == TeacherForm::kHidden) {
        out.teacher_hidden[b].narrow(0, first, resp_len).copy_(s.teacher_hidden);
      } else if (form != TeacherForm::kNone) {
        out.teacher_logprobs[b].narrow(0, first, resp_len).copy_(s.teacher_logprobs);
      }
      if (form == TeacherForm::kTopk) {
        out.teacher_topk_ids[b].narrow(0, first, resp_len).copy_(s.teacher_topk_ids);
      }
      if (out.teacher_tail_logmass.defined()) {
        out.teacher_tail_logmass[b].narrow(0, first, resp_len).copy_(s.teacher_tail_logmass);
      }
    }
  }
  AddSftRows(groups, pad_id, &out);
  return out;
}

}  // namespace kappa::learner
