// The Jinja interpreter on its own, one test per case of
// chat_template_reference/engine_cases.json: each supported construct,
// jinja2's Undefined semantics, Python's errors, and kappa's refusals. The
// expected outputs and errors are jinja2's (ctest
// tasks_jinja_engine_cases_match_jinja2 re-checks them against jinja2).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tasks/jinja/template.h"

namespace kappa::tasks::jinja {
namespace {

using Json = nlohmann::ordered_json;

std::vector<Json> LoadCases() {
  std::ifstream in(KAPPA_ENGINE_CASES);
  std::stringstream text;
  text << in.rdbuf();
  const Json document = Json::parse(text.str());
  return document.at("cases").get<std::vector<Json>>();
}

Dict Variables(const Json& entry) {
  Dict variables;
  if (!entry.contains("context")) return variables;
  for (const auto& [key, value] : entry.at("context").items()) {
    absl::StatusOr<Value> converted = ValueFromJson(value);
    EXPECT_TRUE(converted.ok()) << converted.status();
    variables.Set(Value::String(key), *converted);
  }
  return variables;
}

class EngineCaseTest : public ::testing::TestWithParam<Json> {};

TEST_P(EngineCaseTest, MatchesJinja2) {
  const Json& entry = GetParam();
  const std::string source = entry.at("template").get<std::string>();
  absl::StatusOr<Template> compiled = Template::Parse(source);
  absl::StatusOr<std::string> rendered =
      compiled.ok() ? compiled->Render(Variables(entry)) : absl::StatusOr<std::string>(compiled.status());

  if (entry.value("kappa_only", false)) {
    ASSERT_FALSE(rendered.ok()) << "kappa accepted " << source << " giving " << *rendered;
    EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), entry.at("kappa_error").get<std::string>()))
        << rendered.status().message();
    return;
  }
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  if (entry.contains("output")) {
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(*rendered, entry.at("output").get<std::string>());
    return;
  }
  const Json& error = entry.at("error");
  ASSERT_FALSE(rendered.ok()) << "jinja2 raises " << error.dump() << ", kappa rendered " << *rendered;
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string type = error.at("type").get<std::string>();
  const std::string expected =
      entry.contains("kappa_message")
          ? absl::StrCat(type, ": ", entry.at("kappa_message").get<std::string>())
          : absl::StrCat(type, ": ", error.at("message").get<std::string>());
  EXPECT_TRUE(entry.contains("kappa_message") ? absl::StrContains(rendered.status().message(), expected)
                                              : absl::EndsWith(rendered.status().message(), expected))
      << "expected \"" << expected << "\", got \"" << rendered.status().message() << "\"";
}

INSTANTIATE_TEST_SUITE_P(Jinja2, EngineCaseTest, ::testing::ValuesIn(LoadCases()),
                         [](const ::testing::TestParamInfo<Json>& info) {
                           return info.param.at("name").get<std::string>();
                         });

// Render errors carry the line of the failing expression.
TEST(EngineTest, RenderErrorsNameTheTemplateLine) {
  absl::StatusOr<Template> compiled = Template::Parse("a\nb\n{{ raise_exception('stop') }}");
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  absl::StatusOr<std::string> rendered = compiled->Render(Dict());
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().message(), "template line 3: TemplateError: stop");
}

TEST(EngineTest, StrftimeNowFormatsTheLocalTime) {
  absl::StatusOr<Template> compiled = Template::Parse("{{ strftime_now('%Y-%m-%d') }}");
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const std::time_t now = std::time(nullptr);
  std::tm local;
  localtime_r(&now, &local);
  char expected[32];
  std::strftime(expected, sizeof expected, "%Y-%m-%d", &local);
  absl::StatusOr<std::string> rendered = compiled->Render(Dict());
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, expected);
}

TEST(EngineTest, TrimBlocksCanBeTurnedOff) {
  LexerOptions options;
  options.trim_blocks = false;
  absl::StatusOr<Template> compiled = Template::Parse("{% if true %}\nx{% endif %}", options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_EQ(*compiled->Render(Dict()), "\nx");
}

TEST(EngineTest, RefusesInvalidUtf8Templates) {
  EXPECT_EQ(Template::Parse("\xff").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineTest, DeepMacroRecursionIsAnErrorNotACrash) {
  absl::StatusOr<Template> compiled =
      Template::Parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  absl::StatusOr<std::string> rendered = compiled->Render(Dict());
  ASSERT_FALSE(rendered.ok());
  EXPECT_TRUE(absl::StrContains(rendered.status().message(), "RecursionError"));
}

TEST(EngineTest, DeeplyNestedExpressionsAreRefused) {
  const std::string source = "{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}";
  absl::StatusOr<Template> compiled = Template::Parse(source);
  ASSERT_FALSE(compiled.ok());
  EXPECT_TRUE(absl::StrContains(compiled.status().message(), "nested too deeply"));
}

}  // namespace
}  // namespace kappa::tasks::jinja
