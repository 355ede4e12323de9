// Starting kappa's service binaries one by one, without `kappa run`, for the
// fault tests that need to stop, kill or starve one of them on purpose: a
// tiny run configuration, random-initialised teacher and student checkpoints
// in its data_dir (no SFT: these tests never look at accuracy), and a child
// process that is SERVING on a free loopback port.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <torch/utils.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
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

// A loopback port the kernel just handed out (bind to port 0, then close).
inline std::string FreeLoopbackAddress() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return "127.0.0.1:" + std::to_string(port);
}

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
