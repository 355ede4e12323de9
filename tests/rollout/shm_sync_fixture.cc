// The other process of tests/rollout/shm_sync_test.cc.
//
//   shm_sync_fixture learner PORT_FILE
//     A learner's PolicyPublisher + LearnerService on 127.0.0.1 (port
//     written to PORT_FILE). Reads commands from stdin: "publish V"
//     publishes version V (testing::VersionWeights) and answers
//     "published V"; "quit" or end of input shuts down (unlinking its
//     segments) and exits 0.
//   shm_sync_fixture worker ADDRESS [block]
//     A float32 PolicyWatcher with rollout.weight_transport: shm that prints
//     "loaded V CHECKSUM" for each version it publishes. With `block` it
//     prints "mid-copy V" half-way through copying the first shared-memory
//     version and then hangs there (to be SIGKILLed).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "learner/coordinator.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/work_config.h"
#include "rollout_worker/policy_watcher.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "tests/rollout/shm_test_util.h"

namespace {

using namespace kappa;  // NOLINT: a test fixture's main

int Learner(const std::string& port_file) {
  learner::PolicyPublisher publisher;
  learner::WorkTemplate work;
  work.group_size = 2;
  work.max_new_tokens = 4;
  work.max_outstanding_limit = 4;
  learner::Coordinator coordinator(1, 1, 0, learner::CoordinatorOptions{});
  rollout::testing::EmptyDataset dataset;
  learner::LearnerService service(
      dataset, [](size_t) { return std::vector<int32_t>{1}; }, work,
      learner::GroupExpectationsFor(work, 51), &coordinator, &publisher);
  auto server = services::GrpcServer::Start("127.0.0.1:0", {&service});
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  {
    std::ofstream out(port_file + ".tmp");
    out << (*server)->port() << "\n";
  }
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  std::string command;
  int64_t version = 0;
  while (std::cin >> command) {
    if (command == "quit") break;
    if (command == "publish" && std::cin >> version) {
      publisher.Publish(
          rollout::testing::Snapshot(version, rollout::testing::VersionWeights(version)));
      std::cout << "published " << version << std::endl;
    }
  }
  service.Shutdown();
  publisher.Shutdown();
  (*server)->Shutdown(absl::Milliseconds(200));
  return 0;
}

int Worker(const std::string& address, bool block) {
  rollout::PolicyWatcherOptions options{"fixture", absl::Milliseconds(20), absl::Milliseconds(200)};
  options.dtype = torch::kFloat32;
  if (block) {
    options.shm_mid_copy_hook = [](int64_t version) {
      std::cout << "mid-copy " << version << std::endl;
      while (true) pause();
    };
  }
  rollout::WeightSyncOptions sync{torch::kFloat32, false, false};
  sync.shm = rollout::WeightSyncOptions::Shm::kRequired;
  rollout::PolicyWatcher watcher(services::MakeChannel(address), options, sync);
  watcher.Start();
  int64_t shown = -1;
  while (true) {
    absl::StatusOr<rollout::Policy> policy =
        watcher.WaitForVersion(shown + 1, absl::Now() + absl::Seconds(60));
    if (!policy.ok()) {
      std::cerr << policy.status() << "\n";
      return 1;
    }
    shown = policy->version;
    std::cout << "loaded " << shown << " " << rollout::testing::ModelChecksum(*policy->model)
              << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // stdout carries the answers the test reads; logs go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("fixture"));
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "learner" && argc == 3) return Learner(argv[2]);
  if (mode == "worker" && (argc == 3 || argc == 4)) {
    return Worker(argv[2], argc == 4 && std::string(argv[3]) == "block");
  }
  std::cerr << "usage: shm_sync_fixture learner PORT_FILE | worker ADDRESS [block]\n";
  return 2;
}
