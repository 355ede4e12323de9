// docs/configuration.md is the output of `kappa config-reference`
// (services::ConfigReferenceMarkdown), so it cannot drift from the key table.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/config.h"

#ifndef KAPPA_SOURCE_DIR
#error "KAPPA_SOURCE_DIR must name the source tree (tests/services/CMakeLists.txt)"
#endif

namespace kappa::services {
namespace {

constexpr const char* kRegenerate = "build/cli/kappa config-reference > docs/configuration.md";

// The first line where `a` and `b` differ, for a short failure message.
std::string FirstDifference(const std::string& file, const std::string& generated) {
  const std::vector<std::string> a = absl::StrSplit(file, '\n');
  const std::vector<std::string> b = absl::StrSplit(generated, '\n');
  for (size_t i = 0; i < a.size() || i < b.size(); ++i) {
    const std::string left = i < a.size() ? a[i] : "<end of file>";
    const std::string right = i < b.size() ? b[i] : "<end of output>";
    if (left != right) {
      return absl::StrCat("line ", i + 1, ":\n  docs/configuration.md: ", left,
                          "\n  generated:              ", right);
    }
  }
  return "no line differs";
}

TEST(ConfigReferenceTest, DocsConfigurationMdIsCurrent) {
  const std::string path = std::string(KAPPA_SOURCE_DIR) + "/docs/configuration.md";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path << ": cannot open it; generate it from the repository root with\n  "
                  << kRegenerate;
  std::stringstream text;
  text << in.rdbuf();
  const std::string generated = ConfigReferenceMarkdown();
  EXPECT_TRUE(text.str() == generated)
      << path << " is out of date with the key table in services/config.cc ("
      << FirstDifference(text.str(), generated)
      << ").\nRegenerate it from the repository root (after building the kappa target) with\n  "
      << kRegenerate;
}

TEST(ConfigReferenceTest, EveryKeyHasAOneLineDescriptionAndARow) {
  const std::string reference = ConfigReferenceMarkdown();
  for (const std::string& key : ConfigKeys()) {
    const std::string description = ConfigKeyDescription(key);
    EXPECT_FALSE(description.empty())
        << "config key '" << key << "' has no description in services/config.cc";
    EXPECT_EQ(description.find('\n'), std::string::npos) << key;
    EXPECT_NE(reference.find(absl::StrCat("\n| `", key, "` | ")), std::string::npos) << key;
  }
  EXPECT_EQ(ConfigKeyDescription("trainer.stepz"), "");
}

TEST(ConfigReferenceTest, RowsCarryTypeAndDefault) {
  const std::string reference = ConfigReferenceMarkdown();
  for (const char* row : {
           "| `trainer.steps` | integer | `60` | ",
           "| `seed` | non-negative integer | `1` | ",
           "| `trainer.lr` | number | `0.001` | ",
           "| `m3.lambda_max` | number | `1000.0` | ",
           "| `trainer.norm_std` | boolean | `true` | ",
           "| `name` | string | `demo` | ",
           "| `task.train_path` | string | `\"\"` | ",
           "| `trainer.balance` | list of `naive`, `m3_norm`, `m3_mask`, `m3_project`, `m3_adapt` "
           "| `[naive]` | ",
           "| `trainer.distill_gate` | one of `none`, `all`, `rstg` | `all` | ",
           "| `rollout.stop_strings` | list of names | `[]` | ",
       }) {
    EXPECT_NE(reference.find(row), std::string::npos) << row;
  }
  // One table per top-level section, in the table's order.
  const size_t run = reference.find("\n## run\n");
  const size_t trainer = reference.find("\n## trainer\n");
  const size_t alarms = reference.find("\n## alarms\n");
  EXPECT_NE(run, std::string::npos);
  EXPECT_LT(run, trainer);
  EXPECT_LT(trainer, alarms);
  EXPECT_NE(reference.find(kRegenerate), std::string::npos);
}

TEST(ConfigReferenceTest, IsDeterministic) {
  EXPECT_EQ(ConfigReferenceMarkdown(), ConfigReferenceMarkdown());
}

}  // namespace
}  // namespace kappa::services
