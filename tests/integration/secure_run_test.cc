// `kappa run` with every channel on mutual TLS plus a bearer token: the
// teacher, verifier, learner and a rollout worker, certificates made by
// `openssl` for this test. The run must train every step (so every channel
// and `kappa run`'s readiness probes authenticated), and each process must
// say it uses mutual TLS with a token. What is refused (no token, a wrong
// one, no client certificate, another CA) is tested against a live server in
// tests/services/transport_security_test.cc.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/integration/run_files.h"
#include "tests/integration/tiny_run_config.h"
#include "tests/services/test_pki.h"

namespace {

namespace fs = std::filesystem;
using kappa::testing::ReadAll;

TEST(SecureRunTest, TrainsWithMutualTlsAndABearerTokenOnEveryChannel) {
  const fs::path root = fs::temp_directory_path() / ("kappa-secure-" + std::to_string(getpid()));
  fs::remove_all(root);
  const kappa::testing::TestPki pki = kappa::testing::MakeTestPki((root / "pki").string());
  ASSERT_FALSE(pki.dir.empty()) << ReadAll(root / "pki" / "openssl.log");
  const fs::path token_file = root / "token";
  std::ofstream(token_file) << "e2e-token-7f3a\n";

  const fs::path config = root / "secure.yaml";
  std::ofstream(config) << kappa::testing::TinyRunConfig(
                               "secure", root.string(), 1,
                               "{steps: 3, groups_per_step: 2, group_size: 4, eval_every: 0}")
                        << "security: {tls: true, mutual_tls: true, cert_file: " << pki.Path("node.crt")
                        << ", key_file: " << pki.Path("node.key") << ", ca_file: "
                        << pki.Path("ca.crt") << ", token_file: " << token_file.string() << "}\n";
  const std::string command = std::string(KAPPA_CLI) + " run " + config.string() +
                              " --no-progress > " + (root / "kappa.out").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << ReadAll(root / "kappa.out");

  const fs::path run_dir = root / "runs" / "secure";
  EXPECT_EQ(kappa::testing::CountTrainedSteps(run_dir / "metrics.jsonl"), 3)
      << ReadAll(root / "kappa.out");
  for (const char* log : {"learner.log", "teacher.log", "verifier.log", "rollout-0.log"}) {
    EXPECT_NE(ReadAll(run_dir / "logs" / log).find("mutual TLS + bearer token"), std::string::npos)
        << log << ":\n" << ReadAll(run_dir / "logs" / log);
  }
  fs::remove_all(root);
}

}  // namespace
