// Starting kappa's service binaries one by one, without `kappa run`, for the
// fault tests that need to stop, kill or starve one of them on purpose: a
// tiny run configuration, random-initialised teacher and student checkpoints
// in its data_dir (no SFT: these tests never look at accuracy), and a child
// process that is SERVING on a loopback port it bound itself (SpawnReady).
#pragma once

#include <signal.h>
#include <torch/utils.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "cli/process_supervisor.h"
#include "model/checkpoint.h"
#include "model/tokenizer.h"
#include "services/ready_file.h"
#include "services/server.h"
#include "tests/integration/tiny_run_config.h"

namespace kappa::testing {

// The shape TinyRunConfig gives both models.
inline model::ModelConfig TinyModelConfig() {
  model::ModelConfig config;
  config.vocab_size = model::CharTokenizer().vocab_size();
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.max_position_embeddings = 12;
  config.bos_token_id = model::CharTokenizer::kBos;
  config.eos_token_ids = {model::CharTokenizer::kEos};
  config.pad_token_id = model::CharTokenizer::kPad;
  return config;
}

// Writes `root`/run.yaml (TinyRunConfig with `trainer`) and seeded random
// teacher and student checkpoints where the binaries look for them; returns
// the config path.
inline std::filesystem::path WriteStandaloneRun(const std::filesystem::path& root,
                                                const std::string& trainer) {
  std::filesystem::create_directories(root / "cache");
  torch::manual_seed(7);
  for (const char* role : {"teacher", "student"}) {
    model::Decoder decoder(TinyModelConfig());
    model::SaveCheckpoint((root / "cache" / role).string(), decoder);
  }
  const std::filesystem::path config = root / "run.yaml";
  std::ofstream(config) << TinyRunConfig("standalone", root.string(), 1, trainer);
  return config;
}

// Port 0 on loopback: the kernel chooses when the process binds, and the
// process says which in its --ready-file (SpawnReady). Tests never pick a
// port for another process to bind later: a parallel test could take it
// in between.
inline constexpr char kAnyLoopbackPort[] = "127.0.0.1:0";

// Polls `path` (a service's --ready-file) until the service has written it
// or `timeout`: the addresses it bound, or why not.
inline absl::StatusOr<services::ReadyInfo> AwaitReadyFile(const std::filesystem::path& path,
                                                          std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  absl::StatusOr<services::ReadyInfo> info = services::ReadReadyFile(path.string());
  while (absl::IsNotFound(info.status()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    info = services::ReadReadyFile(path.string());
  }
  return info;
}

// A service a test started, and the addresses it bound.
struct ReadyService {
  pid_t pid = 0;
  services::ReadyInfo ready;
};

// Spawns `spec` with `--ready-file ready_file` appended (its --address and
// --metrics-address, where given, are usually kAnyLoopbackPort) and waits
// until the child has written the file, i.e. every listener it has is
// bound and serving. UNAVAILABLE naming the child and its log when it exits
// first, DEADLINE_EXCEEDED after `timeout`.
inline absl::StatusOr<ReadyService> SpawnReady(
    cli::ProcessSupervisor& supervisor, cli::ProcessSpec spec,
    const std::filesystem::path& ready_file,
    std::chrono::seconds timeout = std::chrono::seconds(60)) {
  std::filesystem::remove(ready_file);
  spec.argv.push_back("--ready-file");
  spec.argv.push_back(ready_file.string());
  absl::StatusOr<pid_t> pid = supervisor.Spawn(spec);
  if (!pid.ok()) return pid.status();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    absl::StatusOr<services::ReadyInfo> info = services::ReadReadyFile(ready_file.string());
    if (info.ok()) return ReadyService{*pid, *std::move(info)};
    if (!absl::IsNotFound(info.status())) return info.status();
    if (std::optional<cli::ExitStatus> exit =
            supervisor.WaitFor(*pid, std::chrono::milliseconds(20))) {
      return absl::UnavailableError(spec.name + " " + exit->ToString() +
                                    " before it was ready; its log: " + spec.log_file);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(spec.name + " wrote no " + ready_file.string() + " in " +
                                         std::to_string(timeout.count()) +
                                         " s; its log: " + spec.log_file);
    }
  }
}

// Polls the gRPC health service until SERVING or `timeout`.
inline bool AwaitServing(const std::string& address, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (services::CheckHealth(address, absl::Milliseconds(500)).ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// `binary` --config `config` `args`..., logging to `log`.
inline cli::ProcessSpec ServiceSpec(const std::string& name, const std::string& binary,
                                    const std::filesystem::path& config,
                                    std::vector<std::string> args,
                                    const std::filesystem::path& log) {
  cli::ProcessSpec spec;
  spec.name = name;
  spec.argv = {binary, "--config", config.string()};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.log_file = log.string();
  return spec;
}

struct TimedExit {
  double seconds = -1;  // from SIGTERM to exit; -1: still running at the limit
  cli::ExitStatus status;
};

// SIGTERM to `pid`, then its exit within `limit`; past the limit it is
// SIGKILLed, so no test leaves a process behind.
inline TimedExit ExitAfterSigterm(cli::ProcessSupervisor& supervisor, pid_t pid,
                                  std::chrono::seconds limit) {
  const auto start = std::chrono::steady_clock::now();
  supervisor.Signal(pid, SIGTERM);
  TimedExit result;
  if (std::optional<cli::ExitStatus> status = supervisor.WaitFor(pid, limit)) {
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.status = *status;
  } else {
    supervisor.Signal(pid, SIGKILL);
    supervisor.WaitFor(pid, std::chrono::seconds(10));
  }
  return result;
}

}  // namespace kappa::testing
