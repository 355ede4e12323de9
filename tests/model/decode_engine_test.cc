#include "model/decode_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/sampling.h"
#include "tests/model/test_models.h"

namespace kappa::model {
namespace {

using testing::TinyDecoder;

std::shared_ptr<Decoder> Shared(Decoder model) {
  return std::make_shared<Decoder>(std::move(model));
}

struct Job {
  std::vector<int64_t> prompt;
  int64_t samples;
  int64_t max_new_tokens;
  TokenSampling sampling;
  std::vector<int64_t> stops;
  uint64_t seed;
};

DecodeRequest RequestOf(const Job& job, uint64_t id, std::shared_ptr<Decoder> model) {
  DecodeRequest request;
  request.id = id;
  request.model = std::move(model);
  request.prompt = job.prompt;
  request.num_samples = job.samples;
  request.max_new_tokens = job.max_new_tokens;
  request.sampling = job.sampling;
  request.stop_token_ids = job.stops;
  request.seed = job.seed;
  return request;
}

// model::Sample of one job alone: its prompt once per row, each row seeded
// as the engine seeds it (greedy: no seeds needed).
std::vector<SampledSequence> SampleAlone(Decoder& model, const Job& job) {
  SamplingParams params;
  params.max_new_tokens = job.max_new_tokens;
  params.temperature = job.sampling.temperature;
  params.top_p = job.sampling.top_p;
  params.top_k = job.sampling.top_k;
  params.min_p = job.sampling.min_p;
  params.stop_token_ids = job.stops;
  params.sampleable_vocab_size = job.sampling.sampleable_vocab_size;
  if (job.sampling.temperature > 0) {
    for (int64_t g = 0; g < job.samples; ++g) params.row_seeds.push_back(RowSeed(job.seed, g));
  }
  return Sample(model, std::vector<std::vector<int64_t>>(job.samples, job.prompt), params);
}

std::map<uint64_t, DecodeResult> RunToIdle(DecodeEngine& engine, int64_t max_rows) {
  std::map<uint64_t, DecodeResult> results;
  int64_t guard = 0;
  while (!engine.Idle()) {
    for (DecodeResult& result : engine.Step()) results[result.id] = std::move(result);
    EXPECT_LE(engine.active_rows(), max_rows);
    if (++guard > 10000) ADD_FAILURE() << "engine never went idle";
    if (guard > 10000) break;
  }
  return results;
}

void ExpectSameSamples(const std::vector<SampledSequence>& got,
                       const std::vector<SampledSequence>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].tokens, want[r].tokens) << what << " row " << r;
    EXPECT_EQ(got[r].truncated, want[r].truncated) << what << " row " << r;
    ASSERT_EQ(got[r].logprobs.size(), want[r].logprobs.size()) << what << " row " << r;
    for (size_t k = 0; k < want[r].logprobs.size(); ++k) {
      EXPECT_NEAR(got[r].logprobs[k], want[r].logprobs[k], 1e-4)
          << what << " row " << r << " t " << k;
    }
  }
}

TokenSampling GreedySampling() { return TokenSampling{0.0, 1.0, 0, 0.0, 0}; }

// Ragged jobs: prompts of 1 to 9 tokens, budgets of 1 to 14, stop ids that
// end some rows early, more rows than slots so rows join and leave mid-run.
std::vector<Job> RaggedJobs(const TokenSampling& sampling) {
  std::vector<Job> jobs = {
      {{1, 5, 6, 7, 8, 9, 10}, 2, 12, sampling, {3}, 11},
      {{1, 4}, 3, 5, sampling, {}, 12},
      {{1, 12, 13, 3, 3}, 2, 14, sampling, {7, 8}, 13},
      {{2}, 1, 1, sampling, {}, 14},
      {{1, 20, 19, 18, 17, 16, 15, 14, 13}, 3, 9, sampling, {0}, 15},
      {{1, 2, 3}, 2, 14, sampling, {5}, 16},
  };
  return jobs;
}

TEST(DecodeEngineTest, GreedyEqualsModelSampleWithRowsJoiningAndLeaving) {
  for (int64_t kv_heads : {4, 2}) {
    auto model = Shared(TinyDecoder(kv_heads));
    const std::vector<Job> jobs = RaggedJobs(GreedySampling());
    DecodeEngine engine(DecodeEngineOptions{4, 0});
    for (size_t i = 0; i < jobs.size(); ++i) engine.Add(RequestOf(jobs[i], i, model));
    const auto results = RunToIdle(engine, 4);
    ASSERT_EQ(results.size(), jobs.size());
    bool some_stopped = false, some_truncated = false;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const std::vector<SampledSequence> want = SampleAlone(*model, jobs[i]);
      ExpectSameSamples(results.at(i).samples, want, "job " + std::to_string(i));
      for (const SampledSequence& s : want) (s.truncated ? some_truncated : some_stopped) = true;
    }
    EXPECT_TRUE(some_stopped && some_truncated) << "the jobs should end both ways";
    // One prefill per request, not per row.
    EXPECT_EQ(engine.stats().prefills, static_cast<int64_t>(jobs.size()));
    // Every slot was used: a request whose G rows do not all fit takes the
    // free slots it finds and places the rest as slots free up.
    EXPECT_EQ(engine.stats().peak_active_rows, 4);
  }
}

TEST(DecodeEngineTest, SeededSamplingEqualsModelSampleWithRowSeeds) {
  auto model = Shared(TinyDecoder(2, /*tied=*/true, 7, /*scale=*/3.0));
  std::vector<Job> jobs = RaggedJobs(TokenSampling{0.9, 1.0, 0, 0.0, 0});
  jobs[1].sampling = TokenSampling{1.2, 0.9, 0, 0.0, 0};
  jobs[2].sampling = TokenSampling{0.8, 1.0, 5, 0.0, 0};
  jobs[4].sampling = TokenSampling{1.0, 0.95, 6, 0.05, 16};
  jobs[5].sampling = GreedySampling();
  DecodeEngine engine(DecodeEngineOptions{3, 24});
  for (size_t i = 0; i < jobs.size(); ++i) engine.Add(RequestOf(jobs[i], 100 + i, model));
  const auto results = RunToIdle(engine, 3);
  ASSERT_EQ(results.size(), jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    ExpectSameSamples(results.at(100 + i).samples, SampleAlone(*model, jobs[i]),
                      "job " + std::to_string(i));
  }
  for (const SampledSequence& s : results.at(104).samples) {
    for (int64_t t : s.tokens) EXPECT_LT(t, 16);
  }
  // Different seeds, different samples.
  Job reseeded = jobs[0];
  reseeded.seed = 99;
  engine.Add(RequestOf(reseeded, 1, model));
  const auto other = RunToIdle(engine, 3);
  EXPECT_NE(other.at(1).samples[0].tokens, results.at(100).samples[0].tokens);
}

// A request's stop check (the worker's stop strings) ends a row the step it
// fires, as stopped, and its slot goes to a waiting row: each row is the
// free run's cut right after the first token the check fires on, and the
// engine samples fewer tokens in fewer steps.
TEST(DecodeEngineTest, AStopCheckEndsARowTheStepItFiresAndFreesItsSlot) {
  auto model = Shared(TinyDecoder(2, /*tied=*/true, 7, /*scale=*/3.0));
  const std::vector<Job> jobs = RaggedJobs(TokenSampling{1.0, 1.0, 0, 0.0, 0});
  const std::vector<int64_t> check_tokens = {4, 9, 11, 17};
  const auto fires_on = [&](int64_t token) {
    return std::find(check_tokens.begin(), check_tokens.end(), token) != check_tokens.end();
  };
  DecodeEngine free_run(DecodeEngineOptions{3, 24});
  DecodeEngine checked(DecodeEngineOptions{3, 24});
  int64_t calls = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    free_run.Add(RequestOf(jobs[i], i, model));
    DecodeRequest request = RequestOf(jobs[i], i, model);
    request.stops_after = [&](const std::vector<int64_t>& response) {
      ++calls;
      EXPECT_FALSE(response.empty());
      return fires_on(response.back());
    };
    checked.Add(std::move(request));
  }
  const auto want = RunToIdle(free_run, 3);
  const auto got = RunToIdle(checked, 3);
  ASSERT_EQ(got.size(), jobs.size());
  int cut = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::vector<SampledSequence> expected = want.at(i).samples;
    for (SampledSequence& sequence : expected) {
      const auto first = std::find_if(sequence.tokens.begin(), sequence.tokens.end(), fires_on);
      // The check is not asked about a row's last token (a stop id or its
      // budget's end): such a row ends as the free run's does.
      if (first == sequence.tokens.end() || first + 1 == sequence.tokens.end()) continue;
      const size_t keep = static_cast<size_t>(first - sequence.tokens.begin()) + 1;
      sequence.tokens.resize(keep);
      sequence.logprobs.resize(keep);
      sequence.truncated = false;
      ++cut;
    }
    ExpectSameSamples(got.at(i).samples, expected, "job " + std::to_string(i));
  }
  EXPECT_GE(cut, 3) << "the check should cut several rows";
  EXPECT_GT(calls, 0);
  EXPECT_LT(checked.stats().tokens, free_run.stats().tokens);
  EXPECT_LT(checked.stats().steps, free_run.stats().steps);
}

TEST(DecodeEngineTest, MemoryStaysWithinTheBoundUnderAQueueOfTenTimesTheSlots) {
  auto model = Shared(TinyDecoder(2));
  const int64_t slots = 4, columns = 20;
  DecodeEngine engine(DecodeEngineOptions{slots, columns});
  const TokenSampling sampling{1.0, 1.0, 0, 0.0, 0};
  for (uint64_t i = 0; i < 40; ++i) {
    const Job job{{1, static_cast<int64_t>(2 + i % 7), 3},
                  1 + static_cast<int64_t>(i % 3),
                  3 + static_cast<int64_t>(i % 15),
                  sampling,
                  {4},
                  i};
    engine.Add(RequestOf(job, i, model));
  }
  EXPECT_EQ(engine.waiting_requests(), 40);
  int64_t steps = 0;
  size_t done = 0;
  const auto& config = (*model)->config();
  const int64_t bound = 2 * config.num_hidden_layers * slots * config.num_key_value_heads *
                        columns * config.head_dim() * static_cast<int64_t>(sizeof(float));
  while (!engine.Idle()) {
    for (const DecodeResult& result : engine.Step()) {
      ++done;
      EXPECT_EQ(result.samples.size(), 1 + result.id % 3);
    }
    EXPECT_LE(engine.active_rows(), slots);
    EXPECT_EQ(engine.stats().kv_cache_bytes, bound);
    ASSERT_LT(++steps, 2000);
  }
  EXPECT_EQ(done, 40u);
  EXPECT_EQ(engine.stats().kv_cache_allocations, 1);
  // Slots were busy: continuous batching keeps most of them occupied.
  EXPECT_GT(static_cast<double>(engine.stats().busy_row_steps) / engine.stats().row_steps, 0.7);
}

TEST(DecodeEngineTest, GrowsItsCacheOnlyForLongerSequences) {
  auto model = Shared(TinyDecoder());
  DecodeEngine engine(DecodeEngineOptions{2, 0});
  const TokenSampling greedy = GreedySampling();
  for (int64_t budget : {2, 2, 3, 10, 4, 30, 5}) {
    engine.Add(RequestOf(Job{{1, 2, 3}, 2, budget, greedy, {}, 0}, 0, model));
    RunToIdle(engine, 2);
  }
  const auto& stats = engine.stats();
  EXPECT_LE(stats.kv_cache_allocations, 4);
  const auto& config = (*model)->config();
  // 3 + 30 − 1 columns at most, within max_position_embeddings (48).
  EXPECT_LE(stats.kv_cache_bytes, 2 * config.num_hidden_layers * 2 * config.num_key_value_heads *
                                      config.max_position_embeddings * config.head_dim() * 4);
}

TEST(DecodeEngineTest, AVersionChangeNeverMixesWeightsWithinASequence) {
  auto v1 = Shared(TinyDecoder(4, false, /*seed=*/7));
  auto v2 = Shared(TinyDecoder(4, false, /*seed=*/8));
  const std::vector<Job> jobs = RaggedJobs(GreedySampling());
  DecodeEngine engine(DecodeEngineOptions{4, 0});
  // v1, v1, v2, v1, v2, v2: queued behind rows of the other version.
  const std::vector<std::shared_ptr<Decoder>> version = {v1, v1, v2, v1, v2, v2};
  engine.Add(RequestOf(jobs[0], 0, v1));
  engine.Add(RequestOf(jobs[1], 1, v1));
  engine.Step();  // v1 rows in the slots
  for (size_t i = 2; i < jobs.size(); ++i) engine.Add(RequestOf(jobs[i], i, version[i]));
  std::map<uint64_t, DecodeResult> results;
  while (!engine.Idle()) {
    for (DecodeResult& r : engine.Step()) results[r.id] = std::move(r);
  }
  ASSERT_EQ(results.size(), jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(results.at(i).model, version[i]) << "job " << i;
    ExpectSameSamples(results.at(i).samples, SampleAlone(*version[i], jobs[i]),
                      "job " + std::to_string(i));
    // The other version samples something else: the check can tell them apart.
    const Decoder& other = version[i] == v1 ? *v2 : *v1;
    Decoder other_copy = other;
    EXPECT_NE(results.at(i).samples[0].tokens, SampleAlone(other_copy, jobs[i])[0].tokens)
        << "job " << i;
  }
}

TEST(DecodeEngineTest, RefusesWhatItCannotServeByName) {
  auto model = Shared(TinyDecoder());
  DecodeEngine engine(DecodeEngineOptions{2, 10});
  auto message = [&](Job job, std::shared_ptr<Decoder> m) {
    try {
      engine.Add(RequestOf(job, 5, std::move(m)));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const TokenSampling greedy = GreedySampling();
  EXPECT_NE(message({{1, 2}, 3, 4, greedy, {}, 0}, model).find("num_samples"), std::string::npos);
  EXPECT_NE(message({{1, 2, 3, 4}, 1, 8, greedy, {}, 0}, model).find("max_sequence_tokens"),
            std::string::npos);
  EXPECT_NE(message({{}, 1, 4, greedy, {}, 0}, model).find("empty prompt"), std::string::npos);
  EXPECT_NE(message({{1, 99}, 1, 4, greedy, {}, 0}, model).find("prompt token 99"),
            std::string::npos);
  EXPECT_NE(message({{1}, 1, 4, greedy, {21}, 0}, model).find("stop id 21"), std::string::npos);
  EXPECT_NE(message({{1}, 1, 4, TokenSampling{1.0, 2.0, 0, 0.0, 0}, {}, 0}, model).find("top_p"),
            std::string::npos);
  EXPECT_NE(message({{1}, 1, 4, greedy, {}, 0}, nullptr).find("no model"), std::string::npos);
  EXPECT_TRUE(engine.Idle()) << "a refused request queues nothing";
  EXPECT_THROW(DecodeEngine(DecodeEngineOptions{0, 0}), std::invalid_argument);
}

TEST(DecodeEngineTest, ClearDropsEverythingAndTheEngineServesOn) {
  auto model = Shared(TinyDecoder());
  DecodeEngine engine(DecodeEngineOptions{2, 0});
  const Job job{{1, 2, 3}, 2, 10, GreedySampling(), {}, 0};
  engine.Add(RequestOf(job, 1, model));
  engine.Add(RequestOf(job, 2, model));
  engine.Step();
  EXPECT_EQ(engine.active_rows(), 2);
  engine.Clear();
  EXPECT_TRUE(engine.Idle());
  engine.Add(RequestOf(job, 3, model));
  const auto results = RunToIdle(engine, 2);
  ASSERT_EQ(results.count(3), 1u);
  ExpectSameSamples(results.at(3).samples, SampleAlone(*model, job), "after Clear");
}

}  // namespace
}  // namespace kappa::model
