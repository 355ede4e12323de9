#include "teacher_server/scorer.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kappa::teacher {

ResponseHiddenRows ResponseHidden(model::Decoder& model,
                                  const std::vector<const TokenSequence*>& sequences) {
  if (sequences.empty()) return {};
  const model::ModelConfig& config = model->config();
  const int64_t batch = static_cast<int64_t>(sequences.size());

  // The last response token predicts nothing we return, so each row feeds
  // prompt + response[:-1]: P + T - 1 tokens.
  int64_t max_len = 0;
  int64_t total_rows = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const TokenSequence& s = *sequences[i];
    if (s.prompt_tokens.empty() || s.response_tokens.empty()) {
      throw std::invalid_argument("sequence " + std::to_string(i) +
                                  ": prompt and response must be non-empty");
    }
    const int64_t len =
        static_cast<int64_t>(s.prompt_tokens.size() + s.response_tokens.size()) - 1;
    if (len > config.max_position_embeddings) {
      throw std::invalid_argument("sequence " + std::to_string(i) + ": " + std::to_string(len) +
                                  " input tokens exceed max_position_embeddings " +
                                  std::to_string(config.max_position_embeddings));
    }
    max_len = std::max(max_len, len);
    total_rows += static_cast<int64_t>(s.response_tokens.size());
  }

  torch::Tensor tokens = torch::full({batch, max_len}, config.pad_token_id, torch::kLong);
  torch::Tensor mask = torch::zeros({batch, max_len}, torch::kBool);
  // Flat row index (b * max_len + position) of every response position.
  torch::Tensor rows = torch::empty({total_rows}, torch::kLong);
  std::vector<int64_t> row_counts;
  row_counts.reserve(sequences.size());
  {
    auto tok = tokens.accessor<int64_t, 2>();
    auto msk = mask.accessor<bool, 2>();
    auto row = rows.accessor<int64_t, 1>();
    int64_t next_row = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const TokenSequence& s = *sequences[b];
      const int64_t prompt_len = static_cast<int64_t>(s.prompt_tokens.size());
      const int64_t response_len = static_cast<int64_t>(s.response_tokens.size());
      int64_t pos = 0;
      for (int64_t id : s.prompt_tokens) {
        if (id < 0 || id >= config.vocab_size) {
          throw std::invalid_argument("token id " + std::to_string(id) + " out of range");
        }
        tok[b][pos] = id;
        msk[b][pos++] = true;
      }
      for (int64_t t = 0; t < response_len; ++t) {
        const int64_t id = s.response_tokens[t];
        if (id < 0 || id >= config.vocab_size) {
          throw std::invalid_argument("token id " + std::to_string(id) + " out of range");
        }
        if (t + 1 == response_len) break;  // predicts nothing we return
        tok[b][pos] = id;
        msk[b][pos++] = true;
      }
      for (int64_t t = 0; t < response_len; ++t) row[next_row++] = b * max_len + prompt_len - 1 + t;
      row_counts.push_back(response_len);
    }
  }

  torch::NoGradGuard no_grad;
  const torch::Device device = model->lm_head()->weight.device();
  // The output projection only at the response rows: prompt positions
  // predict nothing returned, and [B, S, V] logits over every position cost
  // O(V) per prompt token (at S ≈ 1,300 and V = 152k, 3.2 GB of bf16 for 8
  // sequences, issue 38). Padded rows are dropped the same way, which is the
  // same as -inf logits without the fill. Columns past `width` are never
  // computed.
  torch::Tensor hidden = model->ForwardHidden(tokens.to(device), mask.to(device)).hidden;
  return {hidden.reshape({batch * max_len, hidden.size(-1)}).index_select(0, rows.to(device)),
          std::move(row_counts)};
}

torch::Tensor HeadLogProbs(model::Decoder& model, const torch::Tensor& rows, int64_t vocab_limit) {
  const int64_t vocab = model->config().vocab_size;
  if (vocab_limit < 0 || vocab_limit > vocab) {
    throw std::invalid_argument("vocab_limit " + std::to_string(vocab_limit) + " outside [0, " +
                                std::to_string(vocab) + "]");
  }
  torch::NoGradGuard no_grad;
  const int64_t width = vocab_limit > 0 ? vocab_limit : vocab;
  const torch::Tensor gathered =
      torch::nn::functional::linear(rows, model->OutputWeight().narrow(0, 0, width));
  return torch::log_softmax(gathered.to(torch::kFloat32), -1).to(torch::kCPU);
}

std::vector<torch::Tensor> ResponseLogProbs(model::Decoder& model,
                                            const std::vector<const TokenSequence*>& sequences,
                                            int64_t vocab_limit) {
  if (sequences.empty()) return {};
  if (vocab_limit < 0 || vocab_limit > model->config().vocab_size) {
    throw std::invalid_argument("vocab_limit " + std::to_string(vocab_limit) + " outside [0, " +
                                std::to_string(model->config().vocab_size) + "]");
  }
  const ResponseHiddenRows hidden = ResponseHidden(model, sequences);
  return HeadLogProbs(model, hidden.rows, vocab_limit).split_with_sizes(hidden.counts, 0);
}

torch::Tensor TailLogMass(const torch::Tensor& logprobs, const torch::Tensor& ids) {
  // A block of rows at a time: the masked copy of a whole [T, V] row set
  // would double the handler's peak at a real vocabulary (T 512, V 151,936:
  // 311 MB more); a block of 32 rows is 19 MB.
  constexpr int64_t kRowsPerBlock = 32;
  const int64_t rows = logprobs.size(0);
  torch::Tensor tail = torch::empty({rows}, logprobs.options().dtype(torch::kFloat32));
  for (int64_t start = 0; start < rows; start += kRowsPerBlock) {
    const int64_t n = std::min(kRowsPerBlock, rows - start);
    const torch::Tensor outside = logprobs.narrow(0, start, n)
                                      .to(torch::kFloat32)
                                      .scatter(-1, ids.narrow(0, start, n).to(torch::kInt64),
                                               -std::numeric_limits<float>::infinity());
    tail.narrow(0, start, n).copy_(outside.logsumexp(-1));
  }
  return tail;
}

ScoredTensors SelectForm(const torch::Tensor& full_logprobs,
                         const std::vector<int64_t>& response_tokens, ScoreForm form,
                         int64_t top_k) {
  const int64_t rows = full_logprobs.size(0);
  const int64_t vocab = full_logprobs.size(1);
  if (rows != static_cast<int64_t>(response_tokens.size())) {
    throw std::invalid_argument("SelectForm: " + std::to_string(rows) + " rows for " +
                                std::to_string(response_tokens.size()) + " response tokens");
  }
  ScoredTensors out;
  switch (form) {
    case ScoreForm::kFull:
      out.logprobs = full_logprobs.contiguous();
      break;
    case ScoreForm::kTopK: {
      if (top_k < 1 || top_k > vocab) {
        throw std::invalid_argument("top_k " + std::to_string(top_k) + " not in [1, " +
                                    std::to_string(vocab) + "]");
      }
      auto [values, ids] = full_logprobs.topk(top_k, /*dim=*/-1, /*largest=*/true, /*sorted=*/true);
      out.logprobs = values.contiguous();
      out.topk_ids = ids.to(torch::kInt32).contiguous();
      out.tail_logmass = TailLogMass(full_logprobs, ids);
      break;
    }
    case ScoreForm::kSampled: {
      for (int64_t id : response_tokens) {
        if (id < 0 || id >= vocab) {
          throw std::invalid_argument("response token " + std::to_string(id) + " not in [0, " +
                                      std::to_string(vocab) + ")");
        }
      }
      torch::Tensor ids = torch::tensor(response_tokens, torch::kLong).unsqueeze(1);
      out.logprobs = full_logprobs.gather(1, ids).squeeze(1).contiguous();
      break;
    }
    case ScoreForm::kHidden:
      throw std::invalid_argument("SelectForm: hidden rows are not a form of the log-probs");
  }
  return out;
}

namespace {

// INTERNAL naming `field`, `what` and the response position of the first
// non-finite value of `values` ([T] or [T, ...]); OK when there is none.
absl::Status CheckFiniteRows(const torch::Tensor& values, const std::string& field,
                             const std::string& what) {
  const torch::Tensor bad = torch::isfinite(values).logical_not().reshape({-1});
  if (!bad.any().item<bool>()) return absl::OkStatus();
  const int64_t flat = bad.nonzero()[0][0].item<int64_t>();
  const int64_t per_row = values.dim() > 1 ? values.numel() / values.size(0) : 1;
  const float value = values.reshape({-1})[flat].to(torch::kFloat32).item<float>();
  return absl::InternalError(absl::StrCat(field, ": non-finite ", what, " ", value,
                                          " at response position ", flat / per_row,
                                          " (the teacher's own output; not sent)"));
}

}  // namespace

absl::Status CheckFiniteLogProbs(const torch::Tensor& logprobs, const std::string& field) {
  return CheckFiniteRows(logprobs, field, "log-prob");
}

absl::Status CheckFiniteHidden(const torch::Tensor& hidden, const std::string& field) {
  return CheckFiniteRows(hidden, field, "hidden value");
}

std::vector<ScoredTensors> ScoreSequences(model::Decoder& model,
                                          const std::vector<const TokenSequence*>& sequences,
                                          ScoreForm form, int64_t top_k, int64_t vocab_limit) {
  if (form == ScoreForm::kHidden) {
    const ResponseHiddenRows hidden = ResponseHidden(model, sequences);
    std::vector<ScoredTensors> out(sequences.size());
    const std::vector<torch::Tensor> rows =
        hidden.rows.to(torch::kCPU, torch::kFloat32).split_with_sizes(hidden.counts, 0);
    for (size_t i = 0; i < rows.size(); ++i) out[i].hidden = rows[i].contiguous();
    return out;
  }
  std::vector<torch::Tensor> full = ResponseLogProbs(model, sequences, vocab_limit);
  std::vector<ScoredTensors> out;
  out.reserve(full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    out.push_back(SelectForm(full[i], sequences[i]->response_tokens, form, top_k));
  }
  return out;
}

}  // namespace kappa::teacher
