#include "services/cli_flags.h"

#include <gtest/gtest.h>

#include <vector>

#include "services/service_main.h"

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

// The exit-code table of services/service_main.h.
TEST(ServiceMainTest, ExitCodesSeparateConfigurationErrorsFromFailures) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus(), "kappa-test"), 0);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("port in use"), "kappa-test"), 1);
  // INVALID_ARGUMENT alone is not a configuration error: a checkpoint that
  // does not parse is a failure of the run, not of its flags.
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("bad checkpoint"), "kappa-test"), 1);
  const absl::Status bad_key = ConfigurationError(absl::InvalidArgumentError("trainer.x"));
  EXPECT_TRUE(IsConfigurationError(bad_key));
  EXPECT_EQ(bad_key.message(), "trainer.x");
  EXPECT_EQ(ExitCodeFor(bad_key, "kappa-test"), 2);
  EXPECT_EQ(ExitCodeFor(ConfigurationError(absl::FailedPreconditionError("no GPU")), "kappa-test"),
            2);
  EXPECT_TRUE(ConfigurationError(absl::OkStatus()).ok());
}

TEST(ServiceMainTest, HelpAndBadFlagsNeverReachServe) {
  bool served = false;
  const ServiceBinary binary{"kappa-test", "", {}, [&](const CommonFlags&) {
                               served = true;
                               return absl::OkStatus();
                             }};
  const char* help[] = {"kappa-test", "--help"};
  EXPECT_EQ(ServiceMain(2, const_cast<char**>(help), binary), 0);
  const char* bad[] = {"kappa-test", "--no-such-flag"};
  EXPECT_EQ(ServiceMain(2, const_cast<char**>(bad), binary), 2);
  EXPECT_FALSE(served);
  const char* run[] = {"kappa-test"};
  EXPECT_EQ(ServiceMain(1, const_cast<char**>(run), binary), 0);
  EXPECT_TRUE(served);
}

}  // namespace
}  // namespace kappa::services
