// Teacher Score throughput with 1, 4 and 16 concurrent clients: how much the
// dynamic batcher buys when workers score at the same time.
//
// A real TeacherService (demo teacher shape, random weights) behind
// services::GrpcServer on loopback; each client thread sends Score requests
// of one group (G sequences, SAMPLED form, as the demo's rollout workers do)
// back to back. Settings are interleaved round-robin for --rounds rounds of
// --seconds each; reported: response positions scored per second (median
// round), its ratio to one client, and sequences per model batch.
// Usage: kappa_bench_teacher_score [--seconds S] [--rounds N] [--threads T]
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/demo_shape.h"
#include "kappa/v1/teacher.grpc.pb.h"
#include "model/transformer.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "teacher_server/teacher_service.h"

namespace {

constexpr int kGroupSize = 8, kPromptTokens = 6, kResponseTokens = 8;

kappa::v1::ScoreRequest GroupRequest(int seed) {
  kappa::v1::ScoreRequest request;
  request.set_form(kappa::v1::SCORE_FORM_SAMPLED);
  request.set_vocab_size(51);
  for (int s = 0; s < kGroupSize; ++s) {
    kappa::v1::ScoreSequence* sequence = request.add_sequences();
    for (int t = 0; t < kPromptTokens; ++t) sequence->add_prompt_tokens(1 + (seed + t) % 50);
    for (int t = 0; t < kResponseTokens; ++t) sequence->add_response_tokens(1 + (seed * s + t) % 50);
  }
  return request;
}

// Response positions scored per second by `clients` threads for `seconds`.
double Throughput(kappa::v1::Teacher::Stub* stub, int clients, double seconds) {
  std::atomic<int64_t> positions{0};
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      const kappa::v1::ScoreRequest request = GroupRequest(c);
      while (std::chrono::steady_clock::now() < end) {
        grpc::ClientContext context;
        kappa::v1::ScoreResponse response;
        const grpc::Status status = stub->Score(&context, request, &response);
        if (!status.ok()) {
          std::fprintf(stderr, "Score: %s\n", status.error_message().c_str());
          std::exit(1);
        }
        positions += kGroupSize * kResponseTokens;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return static_cast<double>(positions.load()) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2.0;
  int rounds = 3, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  kappa::teacher::TeacherOptions options;
  options.batching.max_batch_sequences = 64;  // configs/demo.yaml
  options.batching.max_wait = absl::Milliseconds(5);
  auto service = kappa::teacher::TeacherService::Create(kappa::model::Decoder(kappa::bench::DemoShape()),
                                                        options);
  if (!service.ok()) {
    std::fprintf(stderr, "%s\n", service.status().ToString().c_str());
    return 1;
  }
  const std::vector<grpc::Service*> served = {service->get()};
  auto server = kappa::services::GrpcServer::Start("127.0.0.1:0", served);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  auto stub = kappa::v1::Teacher::NewStub(
      kappa::services::MakeChannel(absl::StrCat("127.0.0.1:", (*server)->port())));

  const std::vector<int> settings = {1, 4, 16};
  std::vector<std::vector<double>> rates(settings.size());
  std::vector<double> sequences_per_batch(settings.size(), 0.0);
  Throughput(stub.get(), 1, 0.3);  // warm up
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < settings.size(); ++i) {
      const kappa::teacher::DynamicBatcherStats before = (*service)->batcher_stats();
      rates[i].push_back(Throughput(stub.get(), settings[i], seconds));
      const kappa::teacher::DynamicBatcherStats after = (*service)->batcher_stats();
      const int64_t batches = std::max<int64_t>(1, after.batches - before.batches);
      sequences_per_batch[i] += static_cast<double>(after.sequences - before.sequences) /
                                static_cast<double>(batches) / rounds;
    }
  }
  std::printf("demo teacher, groups of %d x (%d prompt + %d response tokens), SAMPLED form, "
              "%d torch threads, %d rounds of %.1f s\n",
              kGroupSize, kPromptTokens, kResponseTokens, threads, rounds, seconds);
  std::printf("| clients | positions/s (median round) | × 1 client | sequences per batch |\n"
              "|---|---|---|---|\n");
  double one = 0;
  for (size_t i = 0; i < settings.size(); ++i) {
    std::sort(rates[i].begin(), rates[i].end());
    const double median = rates[i][rates[i].size() / 2];
    if (i == 0) one = median;
    std::printf("| %d | %.0f | %.2f | %.1f |\n", settings[i], median, median / one,
                sequences_per_batch[i]);
  }
  (*server)->Shutdown();
  (*service)->Shutdown();
  return 0;
}
