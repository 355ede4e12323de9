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

TEST(LoggingTest, UnwritableFileFallsBackToStderr) {
  InitLogging("x", "/nonexistent-dir/x.log");
  spdlog::info("still logging");
  SUCCEED();
}

}  // namespace
}  // namespace kappa::services
