#include "model/decode_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

namespace kappa::model {
namespace {

namespace F = torch::nn::functional;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Fail(const std::string& what) {
  throw std::invalid_argument("DecodeEngine: " + what);
}

// Tokens a prefill batch holds at most (prompts are prefilled together while
// they fit; a longer prompt goes alone), bounding its activations.
constexpr int64_t kMaxPrefillTokens = 8192;

}  // namespace

struct DecodeEngine::Request {
  DecodeRequest spec;
  int64_t budget = 0;   // response tokens each row may sample
  int64_t columns = 0;  // slot columns it needs: prompt + budget - 1
  std::vector<SampledSequence> samples;
  std::vector<RowRandom> random;  // one stream per row
  int64_t rows_left = 0;          // rows that have not finished
  Clock::time_point admitted;
  // From its prefill until every row has a slot: the prompt's keys/values
  // per layer [1, kv, prompt, hd] and the next-token logits [V].
  std::vector<torch::Tensor> prompt_keys, prompt_values;
  torch::Tensor next_logits;
};

namespace {

// The options, checked before the scheduler is built from them.
const DecodeEngineOptions& Checked(const DecodeEngineOptions& options) {
  if (options.max_rows < 1) Fail("max_rows must be >= 1, got " + std::to_string(options.max_rows));
  if (options.max_sequence_tokens < 0) {
    Fail("max_sequence_tokens must be >= 0, got " + std::to_string(options.max_sequence_tokens));
  }
  return options;
}

}  // namespace

DecodeEngine::DecodeEngine(DecodeEngineOptions options)
    : options_(Checked(options)),
      scheduler_(SlotSchedulerOptions{options_.max_rows, kMaxPrefillTokens}),
      slots_(static_cast<size_t>(options_.max_rows)) {}

DecodeEngine::~DecodeEngine() = default;

void DecodeEngine::Add(DecodeRequest spec) {
  if (!spec.model || !*spec.model) Fail("request " + std::to_string(spec.id) + " has no model");
  const ModelConfig& config = (*spec.model)->config();
  const std::string what = "request " + std::to_string(spec.id) + ": ";
  const int64_t prompt = static_cast<int64_t>(spec.prompt.size());
  if (prompt == 0) Fail(what + "empty prompt");
  for (int64_t token : spec.prompt) {
    if (token < 0 || token >= config.vocab_size) {
      Fail(what + "prompt token " + std::to_string(token) + " outside the vocabulary");
    }
  }
  for (int64_t id : spec.stop_token_ids) {
    if (id < 0 || id >= config.vocab_size) {
      Fail(what + "stop id " + std::to_string(id) + " outside the vocabulary");
    }
  }
  if (spec.num_samples < 1 || spec.num_samples > options_.max_rows) {
    Fail(what + "num_samples " + std::to_string(spec.num_samples) + " outside [1, max_rows " +
         std::to_string(options_.max_rows) + "]");
  }
  if (spec.max_new_tokens < 1) {
    Fail(what + "max_new_tokens must be >= 1, got " + std::to_string(spec.max_new_tokens));
  }
  if (!spec.row_seeds.empty() && static_cast<int64_t>(spec.row_seeds.size()) != spec.num_samples) {
    Fail(what + std::to_string(spec.row_seeds.size()) + " row_seeds for " +
         std::to_string(spec.num_samples) + " samples");
  }
  if (spec.sampling.sampleable_vocab_size == 0)
    spec.sampling.sampleable_vocab_size = config.vocab_size;
  ValidateTokenSampling(spec.sampling, config.vocab_size);
  const int64_t budget = std::min(spec.max_new_tokens, config.max_position_embeddings - prompt);
  if (budget < 1) {
    Fail(what + "prompt of " + std::to_string(prompt) +
         " tokens leaves no room in max_position_embeddings " +
         std::to_string(config.max_position_embeddings));
  }
  const int64_t columns = prompt + budget - 1;
  if (options_.max_sequence_tokens > 0 && columns > options_.max_sequence_tokens) {
    Fail(what + "prompt of " + std::to_string(prompt) + " tokens + " + std::to_string(budget) +
         " new tokens needs " + std::to_string(columns) +
         " KV columns, more than max_sequence_tokens " +
         std::to_string(options_.max_sequence_tokens));
  }
  auto request = std::make_unique<Request>();
  request->budget = budget;
  request->columns = columns;
  request->samples.resize(static_cast<size_t>(spec.num_samples));
  for (int64_t g = 0; g < spec.num_samples; ++g) {
    request->random.emplace_back(spec.row_seeds.empty() ? RowSeed(spec.seed, g)
                                                        : spec.row_seeds[static_cast<size_t>(g)]);
  }
  request->rows_left = spec.num_samples;
  const int64_t key = next_key_++;
  scheduler_.Enqueue(key, spec.model.get(), spec.num_samples, prompt);
  request->spec = std::move(spec);
  requests_.emplace(key, std::move(request));
}

void DecodeEngine::Clear() {
  scheduler_.Clear();
  requests_.clear();
  for (Slot& slot : slots_) slot = Slot{};
}

std::vector<DecodeResult> DecodeEngine::Step() {
  std::vector<DecodeResult> finished;
  if (Idle()) return finished;
  torch::NoGradGuard no_grad;
  if (scheduler_.active_rows() > 0) DecodeActiveRows(&finished);
  Admit(&finished);
  ++stats_.steps;
  return finished;
}

void DecodeEngine::DecodeActiveRows(std::vector<DecodeResult>* finished) {
  // Slots [0, n) ride in the step, free ones included (as token 0 at column
  // 0); rows are admitted into the lowest free slots, so n stays small as
  // the queue drains.
  const int64_t n = scheduler_.table().UsedEnd();
  std::vector<int64_t> occupied;
  for (int64_t s = 0; s < n; ++s) {
    if (scheduler_.table().IsUsed(s)) occupied.push_back(s);
  }
  std::vector<int64_t> tokens(static_cast<size_t>(n), 0), lengths(static_cast<size_t>(n), 0);
  std::vector<TokenSampling> settings;
  std::vector<double> uniforms;
  for (int64_t s : occupied) {
    const Slot& slot = slots_[static_cast<size_t>(s)];
    Request& request = *requests_.at(slot.request);
    tokens[static_cast<size_t>(s)] = request.samples[static_cast<size_t>(slot.row)].tokens.back();
    lengths[static_cast<size_t>(s)] = slot.cached;
    stats_.kv_columns_read += slot.cached + 1;
    settings.push_back(request.spec.sampling);
    uniforms.push_back(request.random[static_cast<size_t>(slot.row)].NextUniform());
  }
  torch::Tensor logits = (*model_)->DecodeSlots(tokens, lengths, &cache_);
  if (static_cast<int64_t>(occupied.size()) < n) {
    auto index = torch::tensor(occupied, torch::kLong).to(logits.device());
    logits = logits.index_select(0, index);
  }
  const SampledTokens sampled = SampleTokens(logits, settings, uniforms);
  for (int64_t s : occupied) ++slots_[static_cast<size_t>(s)].cached;
  stats_.row_steps += n;
  stats_.busy_row_steps += static_cast<int64_t>(occupied.size());
  RecordTokens(occupied, sampled, finished);
}

void DecodeEngine::Admit(std::vector<DecodeResult>* finished) {
  const int64_t rows_before = scheduler_.active_rows();
  const AdmissionPlan plan = scheduler_.Schedule();
  if (plan.placements.empty()) return;
  if (!plan.prefill.empty()) {
    model_ = requests_.at(plan.prefill.front())->spec.model;
    EnsureCache(*model_, ColumnsNeeded(plan.prefill), /*carry_rows=*/rows_before > 0);
    Prefill(plan.prefill);
  }
  // Placements come grouped by request: each group copies its prompt once.
  std::vector<int64_t> row_slots;
  std::vector<torch::Tensor> row_logits;
  std::vector<TokenSampling> settings;
  std::vector<double> uniforms;
  std::vector<int64_t> group;  // slots of the current request's rows
  for (size_t i = 0; i < plan.placements.size(); ++i) {
    const RowPlacement& placement = plan.placements[i];
    Request& request = *requests_.at(placement.request);
    slots_[static_cast<size_t>(placement.slot)] =
        Slot{placement.request, placement.row, static_cast<int64_t>(request.spec.prompt.size())};
    group.push_back(placement.slot);
    row_slots.push_back(placement.slot);
    row_logits.push_back(request.next_logits);
    settings.push_back(request.spec.sampling);
    uniforms.push_back(request.random[static_cast<size_t>(placement.row)].NextUniform());
    const bool group_ends =
        i + 1 == plan.placements.size() || plan.placements[i + 1].request != placement.request;
    if (!group_ends) continue;
    CopyPromptIntoSlots(request, group);
    group.clear();
    if (placement.row + 1 == request.spec.num_samples) {
      request.prompt_keys.clear();  // every row has its copy now
      request.prompt_values.clear();
    }
  }
  stats_.peak_active_rows = std::max(stats_.peak_active_rows, scheduler_.active_rows());
  const SampledTokens sampled = SampleTokens(torch::stack(row_logits), settings, uniforms);
  RecordTokens(row_slots, sampled, finished);
}

int64_t DecodeEngine::ColumnsNeeded(const std::vector<int64_t>& ids) const {
  int64_t columns = 0;
  for (const Slot& slot : slots_) {
    if (slot.request >= 0) columns = std::max(columns, requests_.at(slot.request)->columns);
  }
  for (int64_t id : ids) columns = std::max(columns, requests_.at(id)->columns);
  return columns;
}

void DecodeEngine::Prefill(const std::vector<int64_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  int64_t longest = 0;
  for (int64_t id : ids) {
    longest = std::max(longest, static_cast<int64_t>(requests_.at(id)->spec.prompt.size()));
  }
  // Right padding: every prompt starts at column 0, as it will in its slots.
  auto tokens = torch::zeros({n, longest}, torch::kLong);
  auto mask = torch::zeros({n, longest}, torch::kLong);
  std::vector<int64_t> last(static_cast<size_t>(n));
  {
    auto tok_a = tokens.accessor<int64_t, 2>();
    auto mask_a = mask.accessor<int64_t, 2>();
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<int64_t>& prompt = requests_.at(ids[static_cast<size_t>(i)])->spec.prompt;
      for (size_t t = 0; t < prompt.size(); ++t) {
        tok_a[i][static_cast<int64_t>(t)] = prompt[t];
        mask_a[i][static_cast<int64_t>(t)] = 1;
      }
      last[static_cast<size_t>(i)] = static_cast<int64_t>(prompt.size()) - 1;
    }
  }
  Decoder& model = *model_;
  const auto device = model->OutputWeight().device();
  KVCache prefill = model->NewCache(n, longest);
  ForwardOutput out = model->ForwardHidden(tokens.to(device), mask.to(device), {}, &prefill);
  auto last_index = torch::tensor(last, torch::kLong)
                        .to(device)
                        .view({n, 1, 1})
                        .expand({n, 1, out.hidden.size(2)});
  auto logits = F::linear(out.hidden.gather(1, last_index).squeeze(1), model->OutputWeight());
  // Each request keeps its own prompt's keys/values until its rows have
  // copied them (a partly placed request holds them across steps).
  for (int64_t i = 0; i < n; ++i) {
    Request& request = *requests_.at(ids[static_cast<size_t>(i)]);
    const int64_t prompt = static_cast<int64_t>(request.spec.prompt.size());
    for (size_t l = 0; l < prefill.keys.size(); ++l) {
      request.prompt_keys.push_back(prefill.keys[l].narrow(0, i, 1).narrow(2, 0, prompt).clone());
      request.prompt_values.push_back(
          prefill.values[l].narrow(0, i, 1).narrow(2, 0, prompt).clone());
    }
    request.next_logits = logits[i];
    request.admitted = Clock::now();
  }
  stats_.prefills += n;
}

void DecodeEngine::CopyPromptIntoSlots(const Request& request, const std::vector<int64_t>& slots) {
  if (slots.empty()) return;
  const int64_t prompt = static_cast<int64_t>(request.spec.prompt.size());
  const int64_t count = static_cast<int64_t>(slots.size());
  auto target = torch::tensor(slots, torch::kLong).to(request.next_logits.device());
  for (size_t l = 0; l < cache_.keys.size(); ++l) {
    const auto& keys = request.prompt_keys[l];
    const auto& values = request.prompt_values[l];
    cache_.keys[l]
        .narrow(2, 0, prompt)
        .index_copy_(0, target, keys.expand({count, -1, -1, -1}).contiguous());
    cache_.values[l]
        .narrow(2, 0, prompt)
        .index_copy_(0, target, values.expand({count, -1, -1, -1}).contiguous());
  }
}

void DecodeEngine::RecordTokens(const std::vector<int64_t>& slots, const SampledTokens& sampled,
                                std::vector<DecodeResult>* finished) {
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& slot = slots_[static_cast<size_t>(slots[i])];
    Request& request = *requests_.at(slot.request);
    SampledSequence& sequence = request.samples[static_cast<size_t>(slot.row)];
    const int64_t token = sampled.tokens[i];
    sequence.tokens.push_back(token);
    sequence.logprobs.push_back(sampled.logprobs[i]);
    const std::vector<int64_t>& stops = request.spec.stop_token_ids;
    const bool at_budget = static_cast<int64_t>(sequence.tokens.size()) >= request.budget;
    const bool stopped =
        std::find(stops.begin(), stops.end(), token) != stops.end() ||
        (!at_budget && request.spec.stops_after && request.spec.stops_after(sequence.tokens));
    if (!stopped && !at_budget) continue;
    sequence.truncated = !stopped;
    const int64_t key = slot.request;
    slot = Slot{};
    scheduler_.Finish(slots[i]);
    if (--request.rows_left > 0) continue;
    DecodeResult result;
    result.id = request.spec.id;
    result.model = request.spec.model;
    result.samples = std::move(request.samples);
    result.seconds = std::chrono::duration<double>(Clock::now() - request.admitted).count();
    finished->push_back(std::move(result));
    requests_.erase(key);
  }
  stats_.tokens += static_cast<int64_t>(slots.size());
}

void DecodeEngine::EnsureCache(Decoder& model, int64_t columns, bool carry_rows) {
  const ModelConfig& config = model->config();
  const torch::Tensor weight = model->OutputWeight();
  const int64_t capacity =
      options_.max_sequence_tokens > 0
          ? options_.max_sequence_tokens
          : std::min(config.max_position_embeddings, std::max(columns, 2 * cache_.capacity()));
  const bool fits = !cache_.keys.empty() &&
                    static_cast<int64_t>(cache_.keys.size()) == config.num_hidden_layers &&
                    cache_.keys.front().size(1) == config.num_key_value_heads &&
                    cache_.keys.front().size(3) == config.head_dim() &&
                    cache_.keys.front().scalar_type() == weight.scalar_type() &&
                    cache_.keys.front().device() == weight.device() && cache_.capacity() >= columns;
  if (fits) return;
  SlotKVCache grown = model->NewSlotCache(options_.max_rows, std::max(capacity, columns));
  // Rows in slots belong to this model (admission never mixes), so their
  // keys/values carry over when only the capacity grew.
  if (carry_rows && cache_.keys.size() == grown.keys.size()) {
    for (size_t l = 0; l < cache_.keys.size(); ++l) {
      grown.keys[l].narrow(2, 0, cache_.capacity()).copy_(cache_.keys[l]);
      grown.values[l].narrow(2, 0, cache_.capacity()).copy_(cache_.values[l]);
    }
  }
  cache_ = std::move(grown);
  stats_.kv_cache_bytes = cache_.bytes();
  ++stats_.kv_cache_allocations;
}

}  // namespace kappa::model
