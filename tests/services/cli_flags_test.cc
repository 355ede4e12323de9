#include "services/cli_flags.h"

#include <gtest/gtest.h>

#include <vector>

namespace kappa::services {
namespace {

absl::StatusOr<CommonFlags> Parse(std::vector<const char*> args,
                                  const std::vector<std::string>& extra = {}) {
  args.insert(args.begin(), "kappa-test");
  return ParseCommonFlags(static_cast<int>(args.size()), args.data(), extra);
}

TEST(CliFlagsTest, ParsesSharedFlagsInBothForms) {
  absl::StatusOr<CommonFlags> flags =
      Parse({"--config", "run.yaml", "trainer.steps=20", "--address=0.0.0.0:1", "workers=3",
             "--log-file", "x.log", "--health-check=h:1"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->config_path, "run.yaml");
  EXPECT_EQ(flags->overrides, (std::vector<std::string>{"trainer.steps=20", "workers=3"}));
  EXPECT_EQ(flags->address, "0.0.0.0:1");
  EXPECT_EQ(flags->log_file, "x.log");
  EXPECT_EQ(flags->health_check_address, "h:1");
  EXPECT_FALSE(flags->help);
}

TEST(CliFlagsTest, ExtraFlags) {
  absl::StatusOr<CommonFlags> flags = Parse({"--rank", "1", "--world-size=4"}, {"rank", "world-size"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->extra.at("rank"), "1");
  EXPECT_EQ(flags->extra.at("world-size"), "4");
  EXPECT_FALSE(Parse({"--rank", "1"}).ok());  // not declared
}

TEST(CliFlagsTest, Errors) {
  EXPECT_EQ(Parse({"--bogus"}).status().message(), "unknown flag '--bogus'");
  EXPECT_EQ(Parse({"--config"}).status().message(), "flag '--config' needs a value");
  EXPECT_EQ(Parse({"stray"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Parse({"-h"})->help);
}

TEST(CliFlagsTest, ConfigFromFlagsAppliesOverridesToDefaults) {
  absl::StatusOr<CommonFlags> flags = Parse({"trainer.steps=7"});
  ASSERT_TRUE(flags.ok());
  absl::StatusOr<Config> config = LoadConfigFromFlags(*flags);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->trainer.steps, 7);
  EXPECT_EQ(config->name, Config().name);

  flags->config_path = "/nonexistent/run.yaml";
  EXPECT_EQ(LoadConfigFromFlags(*flags).status().code(), absl::StatusCode::kNotFound);
}

TEST(CliFlagsTest, UsageMentionsEveryFlag) {
  const std::string usage = Usage("kappa-x", "  --rank N   data-parallel rank");
  for (const char* flag : {"--config", "--address", "--log-file", "--health-check", "--rank"}) {
    EXPECT_NE(usage.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace kappa::services
