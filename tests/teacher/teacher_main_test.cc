// The kappa-teacher executable end to end: starts on a checkpoint, answers
// health checks and Score, exits cleanly within 2 s of SIGTERM.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "kappa/v1/teacher.grpc.pb.h"
#include "model/checkpoint.h"
#include "services/server.h"
#include "tests/services/subprocess.h"

#ifndef KAPPA_TEACHER_BINARY
#error "KAPPA_TEACHER_BINARY must name the kappa-teacher executable"
#endif

namespace {

using kappa::testing::ReadFile;
using kappa::testing::Spawn;
using kappa::testing::WaitExit;

// A port nothing listens on right now (the kernel's pick for port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(TeacherMainTest, ServesUntilSigtermThenExitsWithinTwoSeconds) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kappa_teacher_main_" + std::to_string(getpid())))
          .string();
  kappa::model::ModelConfig config;
  config.vocab_size = 21;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.max_position_embeddings = 32;
  torch::manual_seed(5);
  kappa::model::Decoder model(config);
  kappa::model::SaveCheckpoint(dir, model);

  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const pid_t pid = Spawn({KAPPA_TEACHER_BINARY, "--checkpoint", dir, "--address", address,
                           "teacher.max_wait_ms=1", "teacher.threads=1"});
  ASSERT_GT(pid, 0);

  absl::Status health = absl::UnavailableError("not probed");
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!health.ok() && absl::Now() < give_up) {
    health = kappa::services::CheckHealth(address, absl::Milliseconds(500));
    if (!health.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(health.ok()) << health;

  // The binary's own probe mode agrees.
  const std::string probe = std::string(KAPPA_TEACHER_BINARY) + " --health-check " + address +
                            " > /dev/null";
  EXPECT_EQ(std::system(probe.c_str()), 0);

  auto stub = kappa::v1::Teacher::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  kappa::v1::ScoreRequest request;
  request.set_vocab_size(21);
  request.set_form(kappa::v1::SCORE_FORM_SAMPLED);
  auto* seq = request.add_sequences();
  seq->add_prompt_tokens(1);
  seq->add_response_tokens(5);
  seq->add_response_tokens(2);
  kappa::v1::ScoreResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::Status status = stub->Score(&ctx, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.sequences_size(), 1);
  EXPECT_EQ(response.sequences(0).logprobs().shape_size(), 1);
  EXPECT_EQ(response.sequences(0).logprobs().shape(0), 2);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int code = WaitExit(pid, std::chrono::milliseconds(2500));
  if (code == -1) kill(pid, SIGKILL);
  EXPECT_EQ(code, 0) << "kappa-teacher did not exit cleanly within 2.5 s of SIGTERM";

  std::filesystem::remove_all(dir);
}

TEST(TeacherMainTest, BadArgumentsExitNonZero) {
  EXPECT_EQ(WaitExit(Spawn({KAPPA_TEACHER_BINARY, "--no-such-flag"}), std::chrono::seconds(10)),
            2);
  EXPECT_EQ(WaitExit(Spawn({KAPPA_TEACHER_BINARY, "--checkpoint", "/nonexistent/kappa",
                            "--address", "127.0.0.1:0"}),
                     std::chrono::seconds(20)),
            1);
  EXPECT_EQ(WaitExit(Spawn({KAPPA_TEACHER_BINARY, "teacher.no_such_key=1"}),
                     std::chrono::seconds(10)),
            2);
}

// A bad setting is refused with 2 before the checkpoint loads (whose failure
// alone is 1), naming the key in the log.
TEST(TeacherMainTest, ConfigurationErrorsExitTwoBeforeTheCheckpointLoads) {
  const std::string log = (std::filesystem::temp_directory_path() /
                           ("kappa_teacher_main_" + std::to_string(getpid()) + ".log"))
                              .string();
  for (const auto& [setting, named] :
       {std::pair<std::string, std::string>{"teacher.device=gpu", "teacher.device: 'gpu'"},
        {"security.max_message_bytes=0", "security.max_message_bytes: expected 1.."}}) {
    std::filesystem::remove(log);
    EXPECT_EQ(WaitExit(Spawn({KAPPA_TEACHER_BINARY, "--checkpoint", "/nonexistent/kappa",
                              "--address", "127.0.0.1:0", "--log-file", log, setting}),
                       std::chrono::seconds(20)),
              2)
        << setting;
    const std::string text = ReadFile(log);
    EXPECT_NE(text.find("kappa-teacher: "), std::string::npos) << text;
    EXPECT_NE(text.find(named), std::string::npos) << text;
    EXPECT_EQ(text.find("cannot load checkpoint"), std::string::npos) << text;
  }
  std::filesystem::remove(log);
}

}  // namespace
