#include "services/logging.h"

#include <gtest/gtest.h>

#include <spdlog/spdlog.h>

#include <fstream>
#include <regex>
#include <sstream>

namespace kappa::services {
namespace {

TEST(LoggingTest, WritesThePatternToTheLogFile) {
  const std::string path = ::testing::TempDir() + "/kappa_logging_test.log";
  std::remove(path.c_str());
  InitLogging("learner%1", path);
  spdlog::info("step {} done", 7);
  spdlog::default_logger()->flush();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(std::regex_search(
      text.str(),
      std::regex(R"(^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[learner%1\] \[info\] step 7 done\n)")))
      << text.str();
}

// The process keeps logging, to stderr, and says why the file is missing.
TEST(LoggingTest, UnwritableFileFallsBackToStderr) {
  ::testing::internal::CaptureStderr();
  InitLogging("x", "/dev/null/x.log");  // under a file: no one can create it
  spdlog::info("still logging");
  spdlog::default_logger()->flush();
  const std::string stderr_text = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(std::regex_search(
      stderr_text, std::regex(R"(\[x\] \[warning\] cannot open log file '/dev/null/x\.log': .+; )"
                              R"(logging to stderr only\n)")))
      << stderr_text;
  EXPECT_TRUE(std::regex_search(stderr_text, std::regex(R"(\[x\] \[info\] still logging\n)")))
      << stderr_text;
}

}  // namespace
}  // namespace kappa::services
