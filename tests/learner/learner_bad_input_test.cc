// Malformed groups and streams sent to a real LearnerService behind a real
// gRPC server on loopback. Each is refused with a precise status naming the
// field, and nothing accepted before it is lost: the good group sent first
// is still buffered (once), a good group sent after is accepted, the server
// is still SERVING.
//
// A refused group does not end the worker's Rollout stream (its other groups
// would be lost with it), so the learner reports it in its log and counters;
// the table reads the status from the log line. Stream-level errors end the
// stream with the status.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kappa/v1/learner.grpc.pb.h"
#include "kappa/v1/teacher.pb.h"
#include "learner/coordinator.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/work_config.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "services/tensor_codec.h"

namespace kappa::learner {
namespace {

constexpr int kVocab = 20;
constexpr int kGroupSize = 2;
constexpr int kMaxNewTokens = 4;
constexpr int kResponseLength = 3;
// The student's max_position_embeddings: the 3-token prompt and a response
// of up to 3 tokens fit.
constexpr int kPositions = 6;
constexpr int64_t kPublishedVersion = 3;
constexpr int kMaxOutstanding = 32;
// Deliberately small so an oversized group is cheap to build.
constexpr int kMaxMessageBytes = 64 << 10;

using Stream = grpc::ClientReaderWriter<kappa::v1::WorkerMessage, kappa::v1::LearnerMessage>;

class TinyDataset final : public tasks::Dataset {
 public:
  TinyDataset() {
    for (int i = 0; i < 8; ++i) {
      examples_.push_back({absl::StrCat("train-", i), absl::StrCat(i, "+1="), absl::StrCat(i + 1),
                           "arithmetic", /*system=*/""});
    }
  }
  size_t size() const override { return examples_.size(); }
  const tasks::Example& at(size_t index) const override { return examples_.at(index); }

 private:
  std::vector<tasks::Example> examples_;
};

// Every log line's text, for the statuses the learner only logs.
class LogLines final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // The text after `prefix` on the first line that has it.
  std::optional<std::string> After(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& line : lines_) {
      const size_t at = line.find(prefix);
      if (at != std::string::npos) return line.substr(at + prefix.size());
    }
    return std::nullopt;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

// Polls `done` for up to five seconds.
bool WaitFor(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

void SetFloats(kappa::v1::Tensor* tensor, const std::vector<int64_t>& shape, float value) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  const std::vector<float> values(static_cast<size_t>(count), value);
  services::SetFloat32(tensor, shape, values.data());
}

// A group the learner accepts for `item`: G responses of three tokens with
// behavior log-probs [3] and full teacher log-probs [3, V].
kappa::v1::ScoredGroup ValidGroup(const kappa::v1::WorkItem& item) {
  kappa::v1::ScoredGroup group;
  group.set_lease_id(item.lease_id());
  group.set_prompt_id(item.prompt_id());
  *group.mutable_prompt_tokens() = item.prompt_tokens();
  group.set_policy_version(kPublishedVersion);
  group.set_worker_id("bad-input-worker");
  for (int s = 0; s < kGroupSize; ++s) {
    kappa::v1::ScoredSample* sample = group.add_samples();
    for (int token : {7, 8, 2}) sample->add_response_tokens(token);
    SetFloats(sample->mutable_behavior_logprobs(), {kResponseLength}, -0.5f);
    SetFloats(sample->mutable_teacher_logprobs(), {kResponseLength, kVocab},
              -std::log(static_cast<float>(kVocab)));
    sample->set_reward(s == 0 ? 1.0f : 0.0f);
    sample->set_response_text("12");
  }
  return group;
}

// The same group for a TOPK work item: teacher rows [3, k] of the k the
// item carries, ids 0..k-1 shifted by the row, log-probs -1, -2, ..., -k,
// and the tail log q(T) = log(1 − Σ_j e^{−1−j}) of each row.
kappa::v1::ScoredGroup ValidTopkGroup(const kappa::v1::WorkItem& item) {
  kappa::v1::ScoredGroup group = ValidGroup(item);
  const int k = item.teacher_top_k();
  for (kappa::v1::ScoredSample& sample : *group.mutable_samples()) {
    std::vector<int32_t> ids;
    std::vector<float> logprobs;
    for (int t = 0; t < kResponseLength; ++t) {
      for (int j = 0; j < k; ++j) {
        ids.push_back((t + j) % kVocab);
        logprobs.push_back(-1.0f - static_cast<float>(j));
      }
    }
    services::SetFloat32(sample.mutable_teacher_logprobs(), {kResponseLength, k},
                         logprobs.data());
    kappa::v1::Tensor* wire_ids = sample.mutable_teacher_topk_ids();
    wire_ids->set_dtype(kappa::v1::DTYPE_INT32);
    wire_ids->add_shape(kResponseLength);
    wire_ids->add_shape(k);
    wire_ids->set_data(ids.data(), ids.size() * sizeof(int32_t));
    double top_mass = 0;
    for (int j = 0; j < k; ++j) top_mass += std::exp(-1.0 - j);
    SetFloats(sample.mutable_teacher_tail_logmass(), {kResponseLength},
              static_cast<float>(std::log(1.0 - top_mass)));
  }
  return group;
}

void SetIntAt(kappa::v1::Tensor* tensor, int index, int32_t value) {
  std::memcpy(tensor->mutable_data()->data() + 4 * index, &value, 4);
}

void SetFloatAt(kappa::v1::Tensor* tensor, int index, float value) {
  std::memcpy(tensor->mutable_data()->data() + 4 * index, &value, 4);
}

struct BadGroup {
  const char* name;
  std::function<void(kappa::v1::ScoredGroup&)> mutate;
  const char* code;     // absl status code name as the learner logs it
  std::string message;  // must appear in the logged status message
};

class LearnerBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_ = std::make_shared<LogLines>();
    spdlog::default_logger()->sinks().push_back(log_);

    work_.group_size = kGroupSize;
    work_.max_new_tokens = kMaxNewTokens;
    work_.teacher_form = kappa::v1::SCORE_FORM_FULL;
    work_.max_outstanding_limit = kMaxOutstanding;
    Configure(work_);
    CoordinatorOptions options;
    options.buffer_groups = 2 * kMaxOutstanding;
    options.lease_timeout = absl::Seconds(60);
    coordinator_ = std::make_unique<Coordinator>(dataset_.size(), /*seed=*/1, 0, options);
    auto snapshot = std::make_shared<PolicySnapshot>();
    snapshot->version = kPublishedVersion;
    publisher_.Publish(snapshot);
    service_ = std::make_unique<LearnerService>(
        dataset_,
        [](size_t) {
          return std::vector<int32_t>{1, 5, 6};
        },
        work_, Expectations(), coordinator_.get(), &publisher_);
    services::ServerOptions server_options;
    server_options.max_message_bytes = kMaxMessageBytes;
    auto server = services::GrpcServer::Start("127.0.0.1:0", {service_.get()}, server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    stub_ = kappa::v1::Learner::NewStub(services::MakeChannel(address_));
  }

  GroupExpectations Expectations() const {
    GroupExpectations expect = GroupExpectationsFor(work_, kVocab);
    expect.max_positions = kPositions;
    return expect;
  }

  // Lets a derived fixture change what the work items ask for.
  virtual void Configure(WorkTemplate& /*work*/) {}

  void TearDown() override {
    if (service_) service_->Shutdown();
    if (coordinator_) coordinator_->Shutdown();
    publisher_.Shutdown();
    if (server_) server_->Shutdown(absl::Seconds(1));
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log_), sinks.end());
  }

  // Opens a Rollout stream on `context` and says hello.
  std::unique_ptr<Stream> Open(grpc::ClientContext* context, int max_outstanding,
                               const std::string& worker_id = "bad-input-worker") {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    std::unique_ptr<Stream> stream = stub_->Rollout(context);
    kappa::v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(worker_id);
    hello.mutable_hello()->set_max_outstanding(max_outstanding);
    EXPECT_TRUE(stream->Write(hello));
    return stream;
  }

  // Reads `count` work items (each followed by its credit).
  static std::vector<kappa::v1::WorkItem> ReadWork(Stream* stream, int count) {
    std::vector<kappa::v1::WorkItem> items;
    kappa::v1::LearnerMessage message;
    while (static_cast<int>(items.size()) < count && stream->Read(&message)) {
      if (message.has_work()) items.push_back(message.work());
    }
    return items;
  }

  // Half-closes and returns the stream's status. gRPC delivers the status
  // only after every message the server sent has been read.
  static grpc::Status Close(Stream* stream) {
    stream->WritesDone();
    kappa::v1::LearnerMessage unread;
    while (stream->Read(&unread)) {
    }
    return stream->Finish();
  }

  static bool Send(Stream* stream, const kappa::v1::ScoredGroup& group) {
    kappa::v1::WorkerMessage message;
    *message.mutable_group() = group;
    return stream->Write(message);
  }

  // Sends row r of `table` as the group for items[r + 1] (a valid group
  // mutated) and checks the learner logs its refusal with the row's code and
  // message; the stream stays open throughout.
  void ExpectEachRefused(
      Stream* stream, const std::vector<BadGroup>& table,
      const std::vector<kappa::v1::WorkItem>& items,
      const std::function<kappa::v1::ScoredGroup(const kappa::v1::WorkItem&)>& valid) {
    for (size_t row = 0; row < table.size(); ++row) {
      const BadGroup& bad = table[row];
      kappa::v1::ScoredGroup group = valid(items[row + 1]);
      bad.mutate(group);
      ASSERT_TRUE(Send(stream, group)) << bad.name << ": the stream ended";
      const std::string prefix =
          absl::StrCat(" group for lease ", group.lease_id(), ": ", bad.code, ": ");
      std::optional<std::string> message;
      if (!WaitFor([&] { return (message = log_->After(prefix)).has_value(); })) {
        ADD_FAILURE() << bad.name << ": no '" << prefix << "' logged";
        continue;
      }
      EXPECT_NE(message->find(bad.message), std::string::npos)
          << bad.name << ": logged '" << *message << "'";
    }
  }

  bool WaitAccepted(int64_t count) {
    return WaitFor([&] { return coordinator_->counters().groups_accepted >= count; });
  }

  TinyDataset dataset_;
  WorkTemplate work_;
  std::unique_ptr<Coordinator> coordinator_;
  PolicyPublisher publisher_;
  std::unique_ptr<LearnerService> service_;
  std::unique_ptr<services::GrpcServer> server_;
  std::string address_;
  std::unique_ptr<kappa::v1::Learner::Stub> stub_;
  std::shared_ptr<LogLines> log_;
};

TEST_F(LearnerBadInputTest, EachMalformedGroupIsRefusedByNameAndNothingIsLost) {
  // Set below, once the good group's lease is known (the duplicate row).
  std::string accepted_lease;
  const std::vector<BadGroup> table = {
      {"wrong dtype",
       [](auto& g) {
         g.mutable_samples(1)->mutable_behavior_logprobs()->set_dtype(kappa::v1::DTYPE_INT32);
       },
       "INVALID_ARGUMENT",
       "samples[1].behavior_logprobs: dtype int32 is not a floating type (float32, bfloat16 or "
       "float16)"},
      {"no dtype",
       [](auto& g) {
         g.mutable_samples(0)->mutable_teacher_logprobs()->set_dtype(kappa::v1::DTYPE_UNSPECIFIED);
       },
       "INVALID_ARGUMENT", "samples[0].teacher_logprobs: unsupported dtype 0 (unspecified)"},
      {"byte count",
       [](auto& g) {
         g.mutable_samples(0)->mutable_behavior_logprobs()->mutable_data()->resize(8);
       },
       "INVALID_ARGUMENT",
       "samples[0].behavior_logprobs: 8 bytes for shape [3] of float32 (expected 12)"},
      {"shape",
       [](auto& g) { SetFloats(g.mutable_samples(1)->mutable_behavior_logprobs(), {2}, -1.0f); },
       "INVALID_ARGUMENT", "samples[1].behavior_logprobs: expected shape [3], got [2]"},
      {"NaN behavior log-prob",
       [](auto& g) {
         SetFloatAt(g.mutable_samples(1)->mutable_behavior_logprobs(), 2, std::nanf(""));
       },
       "INVALID_ARGUMENT", "samples[1].behavior_logprobs: non-finite value nan at flat index 2"},
      {"Inf teacher log-prob",
       [](auto& g) {
         SetFloatAt(g.mutable_samples(0)->mutable_teacher_logprobs(), kVocab + 4,
                    -std::numeric_limits<float>::infinity());
       },
       "INVALID_ARGUMENT", "samples[0].teacher_logprobs: non-finite value -inf at flat index 24"},
      {"teacher vocabulary",
       [](auto& g) {
         SetFloats(g.mutable_samples(0)->mutable_teacher_logprobs(), {kResponseLength, 30}, -3.4f);
       },
       "INVALID_ARGUMENT",
       "samples[0].teacher_logprobs: teacher vocabulary size 30 does not match the student's 20"},
      {"non-UTF-8 response text",
       [](auto& g) { g.mutable_samples(1)->set_response_text("12 \xff\xfe"); }, "INVALID_ARGUMENT",
       "samples[1].response_text: not valid UTF-8"},
      {"empty response", [](auto& g) { g.mutable_samples(1)->clear_response_tokens(); },
       "INVALID_ARGUMENT", "samples[1].response_tokens: empty"},
      {"response longer than max_new_tokens",
       [](auto& g) {
         g.mutable_samples(0)->add_response_tokens(3);
         g.mutable_samples(0)->add_response_tokens(2);
       },
       "INVALID_ARGUMENT", "samples[0].response_tokens: length 5 exceeds max_new_tokens 4"},
      {"response token out of range",
       [](auto& g) { g.mutable_samples(1)->set_response_tokens(2, 999); }, "INVALID_ARGUMENT",
       "samples[1].response_tokens[2]: token id 999 outside [0, 20)"},
      {"prompt token out of range", [](auto& g) { g.set_prompt_tokens(0, -1); }, "INVALID_ARGUMENT",
       "prompt_tokens[0]: token id -1 outside [0, 20)"},
      {"group size", [](auto& g) { g.mutable_samples()->RemoveLast(); }, "INVALID_ARGUMENT",
       "samples: expected 2 samples, got 1"},
      {"reward not binary", [](auto& g) { g.mutable_samples(0)->set_reward(0.5f); },
       "INVALID_ARGUMENT", "samples[0].reward: 0.5 is not 0 or 1"},
      // What the learner handed out: the leased prompt, within the student's positions.
      {"prompt not the leased example's", [](auto& g) { g.set_prompt_tokens(1, 9); },
       "INVALID_ARGUMENT", "prompt_tokens: not the prompt of the example lease "},
      {"prompt and response beyond the positions",
       [](auto& g) {
         kappa::v1::ScoredSample* sample = g.mutable_samples(0);
         sample->add_response_tokens(2);  // 4 <= max_new_tokens, but 3 + 4 > 6
         SetFloats(sample->mutable_behavior_logprobs(), {4}, -0.5f);
         SetFloats(sample->mutable_teacher_logprobs(), {4, kVocab}, -3.0f);
       },
       "INVALID_ARGUMENT",
       "samples[0].response_tokens: 3 prompt + 4 response tokens exceed the student's "
       "max_position_embeddings 6"},
      {"prompt leaving no position",
       [](auto& g) {
         for (int token : {7, 8, 9}) g.add_prompt_tokens(token);
       },
       "INVALID_ARGUMENT",
       "prompt_tokens: length 6 leaves no position for a response (the student's "
       "max_position_embeddings is 6)"},
      {"policy version never published", [](auto& g) { g.set_policy_version(9); },
       "INVALID_ARGUMENT", "policy_version: 9 was never published (latest is 3)"},
      {"negative policy version", [](auto& g) { g.set_policy_version(-1); }, "INVALID_ARGUMENT",
       "policy_version: -1 was never published (latest is 3)"},
      {"duplicate group", [&](auto& g) { g.set_lease_id(accepted_lease); }, "ALREADY_EXISTS",
       "' already returned its group; this copy is dropped"},
      {"lease never issued", [](auto& g) { g.set_lease_id("no-such-lease"); }, "NOT_FOUND",
       "lease_id: lease 'no-such-lease' is not open (expired, re-issued or never issued)"},
  };

  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = Open(&context, kMaxOutstanding);
  // One lease for the good group before, one per row, one for the good group after.
  const int needed = static_cast<int>(table.size()) + 2;
  ASSERT_LE(needed, kMaxOutstanding);
  const std::vector<kappa::v1::WorkItem> items = ReadWork(stream.get(), needed);
  ASSERT_EQ(static_cast<int>(items.size()), needed);

  ASSERT_TRUE(Send(stream.get(), ValidGroup(items[0])));
  ASSERT_TRUE(WaitAccepted(1));
  accepted_lease = items[0].lease_id();

  ExpectEachRefused(stream.get(), table, items, ValidGroup);

  ASSERT_TRUE(Send(stream.get(), ValidGroup(items.back())));
  ASSERT_TRUE(WaitAccepted(2));
  EXPECT_TRUE(Close(stream.get()).ok());

  const CoordinatorCounters counters = coordinator_->counters();
  EXPECT_EQ(counters.groups_accepted, 2);
  EXPECT_EQ(counters.dropped_duplicate, 1);
  EXPECT_EQ(counters.dropped_unknown_lease, 1);  // the never-issued lease
  EXPECT_EQ(service_->counters().groups_invalid, static_cast<int64_t>(table.size()) - 2);
  EXPECT_EQ(service_->counters().refused_prompt, 1);
  EXPECT_EQ(service_->counters().refused_positions, 2);
  EXPECT_EQ(service_->counters().refused_policy_version, 2);
  EXPECT_EQ(service_->counters().refused_malformed, static_cast<int64_t>(table.size()) - 2 - 5);
  // Both good groups, each once, in arrival order, nothing from a bad row.
  const std::vector<BufferedGroup> batch =
      coordinator_->TakeBatch(2, kPublishedVersion, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].lease_id, items[0].lease_id());
  EXPECT_EQ(batch[1].lease_id, items.back().lease_id());
  EXPECT_EQ(batch[0].group.samples.size(), static_cast<size_t>(kGroupSize));
  EXPECT_EQ(coordinator_->counters().buffered, 0);
  EXPECT_TRUE(services::CheckHealth(address_, absl::Seconds(2)).ok());
}

// The same service asking for the teacher's top-k (topk_reverse_kl): the
// work items carry the form and k, a group with those rows is accepted, and
// rows of another shape, k or vocabulary are refused by name.
class LearnerBadTopkInputTest : public LearnerBadInputTest {
 protected:
  static constexpr int kTopK = 3;
  void Configure(WorkTemplate& work) override {
    work.teacher_form = kappa::v1::SCORE_FORM_TOPK;
    work.teacher_top_k = kTopK;
  }
};

TEST_F(LearnerBadTopkInputTest, TopkRowsAreCheckedAgainstTheWorkItem) {
  const std::vector<BadGroup> table = {
      {"top-k: another k",
       [](auto& g) {
         SetFloats(g.mutable_samples(1)->mutable_teacher_logprobs(), {kResponseLength, 4}, -2.f);
       },
       "INVALID_ARGUMENT", "samples[1].teacher_logprobs: shape [3, 4] does not match [3, 3]"},
      {"top-k: full rows",
       [](auto& g) {
         SetFloats(g.mutable_samples(0)->mutable_teacher_logprobs(), {kResponseLength, kVocab},
                   -3.f);
       },
       "INVALID_ARGUMENT", "samples[0].teacher_logprobs: shape [3, 20] does not match [3, 3]"},
      {"top-k: no ids", [](auto& g) { g.mutable_samples(0)->clear_teacher_topk_ids(); },
       "INVALID_ARGUMENT", "samples[0].teacher_topk_ids: dtype unspecified is not an integer type"},
      {"top-k: ids of another shape",
       [](auto& g) { g.mutable_samples(1)->mutable_teacher_topk_ids()->set_shape(1, 2); },
       "INVALID_ARGUMENT", "samples[1].teacher_topk_ids: 36 bytes for shape [3, 2]"},
      {"top-k: id out of range",
       [](auto& g) { SetIntAt(g.mutable_samples(1)->mutable_teacher_topk_ids(), 4, kVocab); },
       "INVALID_ARGUMENT", "samples[1].teacher_topk_ids[1, 1]: token id 20 outside [0, 20)"},
      {"top-k: repeated id",
       [](auto& g) { SetIntAt(g.mutable_samples(0)->mutable_teacher_topk_ids(), 8, 2); },
       "INVALID_ARGUMENT", "samples[0].teacher_topk_ids[2]: token id 2 appears twice"},
      {"top-k: positive log-prob",
       [](auto& g) { SetFloatAt(g.mutable_samples(0)->mutable_teacher_logprobs(), 5, 2.0f); },
       "INVALID_ARGUMENT", "samples[0].teacher_logprobs[1, 2]: 2 is not a log-probability"},
      {"top-k: NaN log-prob",
       [](auto& g) {
         SetFloatAt(g.mutable_samples(1)->mutable_teacher_logprobs(), 0, std::nanf(""));
       },
       "INVALID_ARGUMENT", "samples[1].teacher_logprobs: non-finite value nan at flat index 0"},
      {"top-k: no tail mass", [](auto& g) { g.mutable_samples(1)->clear_teacher_tail_logmass(); },
       "INVALID_ARGUMENT",
       "samples[1].teacher_tail_logmass: missing; the TOPK form needs the teacher's float32 "
       "tail mass"},
      {"top-k: tail mass of another length",
       [](auto& g) { SetFloats(g.mutable_samples(0)->mutable_teacher_tail_logmass(), {2}, -1.f); },
       "INVALID_ARGUMENT", "samples[0].teacher_tail_logmass: shape [2] does not match [3]"},
      {"top-k: bfloat16 tail mass",
       [](auto& g) {
         g.mutable_samples(0)->mutable_teacher_tail_logmass()->set_dtype(kappa::v1::DTYPE_BFLOAT16);
       },
       "INVALID_ARGUMENT", "samples[0].teacher_tail_logmass: dtype bfloat16 is not float32"},
      {"top-k: positive tail mass",
       [](auto& g) { SetFloatAt(g.mutable_samples(1)->mutable_teacher_tail_logmass(), 2, 0.5f); },
       "INVALID_ARGUMENT", "samples[1].teacher_tail_logmass[2]: 0.5 is not a log-mass"},
  };

  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = Open(&context, kMaxOutstanding);
  const int needed = static_cast<int>(table.size()) + 2;
  const std::vector<kappa::v1::WorkItem> items = ReadWork(stream.get(), needed);
  ASSERT_EQ(static_cast<int>(items.size()), needed);
  for (const kappa::v1::WorkItem& item : items) {
    ASSERT_EQ(item.teacher_form(), kappa::v1::SCORE_FORM_TOPK);
    ASSERT_EQ(item.teacher_top_k(), kTopK);
  }
  ASSERT_TRUE(Send(stream.get(), ValidTopkGroup(items[0])));
  ASSERT_TRUE(WaitAccepted(1));

  ExpectEachRefused(stream.get(), table, items, ValidTopkGroup);

  ASSERT_TRUE(Send(stream.get(), ValidTopkGroup(items.back())));
  ASSERT_TRUE(WaitAccepted(2));
  EXPECT_TRUE(Close(stream.get()).ok());
  EXPECT_EQ(service_->counters().groups_invalid, static_cast<int64_t>(table.size()));
  const std::vector<BufferedGroup> batch =
      coordinator_->TakeBatch(2, kPublishedVersion, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(batch.size(), 2u);
  // Compact for the loss: [T, k] log-probs of [T, k] ids.
  const torch::Tensor& teacher = batch[0].group.samples[0].teacher_logprobs;
  const torch::Tensor& ids = batch[0].group.samples[0].teacher_topk_ids;
  ASSERT_EQ(teacher.sizes(), ids.sizes());
  ASSERT_EQ(teacher.size(0), kResponseLength);
  EXPECT_EQ(ids[1][1].item<int64_t>(), 2);  // row 1, j = 1: id 2
  EXPECT_FLOAT_EQ(teacher[1][1].item<float>(), -2.0f);
}

// Exposes the fixture's helpers to the stream rows.
class LearnerBadStreamTest : public LearnerBadInputTest {
 public:
  grpc::Status FirstMessageIsAGroup() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::unique_ptr<Stream> stream = stub_->Rollout(&context);
    kappa::v1::WorkItem item;
    item.set_lease_id("x");
    item.add_prompt_tokens(1);
    Send(stream.get(), ValidGroup(item));
    return Close(stream.get());
  }

  grpc::Status Hello(const std::string& worker_id, int max_outstanding) {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = Open(&context, max_outstanding, worker_id);
    return Close(stream.get());
  }

  // Two groups on one credit: the first names an unknown lease, so its real
  // lease stays open and no second credit is granted.
  grpc::Status MoreGroupsThanCredits() {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = Open(&context, 1);
    const std::vector<kappa::v1::WorkItem> items = ReadWork(stream.get(), 1);
    if (items.empty()) return grpc::Status(grpc::StatusCode::UNKNOWN, "no work item");
    kappa::v1::ScoredGroup group = ValidGroup(items[0]);
    group.set_lease_id("unknown");
    Send(stream.get(), group);
    Send(stream.get(), group);
    return Close(stream.get());
  }

  // A good group, then one larger than the server's max message size.
  grpc::Status Oversized() {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = Open(&context, 2);
    const std::vector<kappa::v1::WorkItem> items = ReadWork(stream.get(), 2);
    if (items.size() != 2) return grpc::Status(grpc::StatusCode::UNKNOWN, "no work items");
    const int64_t accepted = coordinator_->counters().groups_accepted;
    Send(stream.get(), ValidGroup(items[0]));
    if (!WaitAccepted(accepted + 1)) {
      return grpc::Status(grpc::StatusCode::UNKNOWN, "good group lost");
    }
    kappa::v1::ScoredGroup big = ValidGroup(items[1]);
    big.mutable_samples(0)->set_response_text(std::string(kMaxMessageBytes, 'a'));
    Send(stream.get(), big);
    return Close(stream.get());
  }
};

struct BadStream {
  const char* name;
  // Drives one stream and returns how it ended.
  std::function<grpc::Status(LearnerBadStreamTest*)> run;
  grpc::StatusCode code;
  std::string message;  // must appear in the status message
};

TEST_F(LearnerBadStreamTest, EachMalformedStreamEndsWithAPreciseStatus) {
  const std::vector<BadStream> table = {
      {"first message is a group", [](auto* t) { return t->FirstMessageIsAGroup(); },
       grpc::StatusCode::INVALID_ARGUMENT, "hello: the first message must be a Hello"},
      {"empty worker id", [](auto* t) { return t->Hello("", 1); },
       grpc::StatusCode::INVALID_ARGUMENT, "hello.worker_id: empty"},
      {"max_outstanding 0", [](auto* t) { return t->Hello("w", 0); },
       grpc::StatusCode::INVALID_ARGUMENT, "hello.max_outstanding: 0 outside [1, 32]"},
      {"max_outstanding above the limit", [](auto* t) { return t->Hello("w", 33); },
       grpc::StatusCode::INVALID_ARGUMENT, "hello.max_outstanding: 33 outside [1, 32]"},
      {"more groups than credits", [](auto* t) { return t->MoreGroupsThanCredits(); },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "group: sent 2 groups with only 1 credits"},
      {"oversized group", [](auto* t) { return t->Oversized(); },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "larger than max"},
  };
  for (const BadStream& bad : table) {
    const grpc::Status status = bad.run(this);
    EXPECT_EQ(status.error_code(), bad.code) << bad.name << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(bad.message), std::string::npos)
        << bad.name << ": " << status.error_message();
  }
  // The good group sent before the oversized one is still buffered, the
  // server is SERVING and a new stream gets work.
  EXPECT_EQ(coordinator_->counters().groups_accepted, 1);
  EXPECT_EQ(coordinator_->counters().buffered, 1);
  EXPECT_TRUE(services::CheckHealth(address_, absl::Seconds(2)).ok());
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = Open(&context, 1);
  const std::vector<kappa::v1::WorkItem> items = ReadWork(stream.get(), 1);
  ASSERT_EQ(items.size(), 1u);
  ASSERT_TRUE(Send(stream.get(), ValidGroup(items[0])));
  EXPECT_TRUE(WaitAccepted(2));
  EXPECT_TRUE(Close(stream.get()).ok());
}

}  // namespace
}  // namespace kappa::learner
