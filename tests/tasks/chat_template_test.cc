// ChatTemplate's API: what transformers passes to the template (messages,
// tools/documents = None, add_generation_prompt, special_tokens_map, extra
// variables), the model-directory loader, and its errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "tasks/chat_template.h"

namespace kappa::tasks {
namespace {

namespace fs = std::filesystem;

class ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("chat_template_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }

  std::string Render(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                     const ChatRenderOptions& options = {}) {
    absl::StatusOr<std::string> rendered = chat_template.Render(messages, options);
    EXPECT_TRUE(rendered.ok()) << rendered.status();
    return rendered.ok() ? *rendered : "";
  }

  fs::path dir_;
};

TEST_F(ChatTemplateTest, PassesTransformersVariables) {
  auto chat_template = ChatTemplate::Parse(
      "{{ messages | length }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|"
      "{{ messages[0].role }}:{{ messages[0]['content'] }}|{{ bos_token is defined }}");
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(Render(*chat_template, {{"user", "hi"}}), "1|None|None|True|user:hi|False");
  ChatRenderOptions options;
  options.add_generation_prompt = false;
  EXPECT_EQ(Render(*chat_template, {{"user", "hi"}}, options), "1|None|None|False|user:hi|False");
}

TEST_F(ChatTemplateTest, SpecialTokensAreSetOnlyWhenNonEmpty) {
  ChatSpecialTokens tokens;
  tokens.bos_token = "<s>";
  tokens.eos_token = "";
  tokens.additional_special_tokens = {"<a>", "<b>"};
  auto chat_template = ChatTemplate::Parse(
      "{{ bos_token }}|{{ eos_token is defined }}|{{ pad_token is defined }}|"
      "{{ additional_special_tokens }}",
      tokens);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(Render(*chat_template, {}), "<s>|False|False|['<a>', '<b>']");
}

TEST_F(ChatTemplateTest, ExtraContextOverridesSpecialTokensAndFillsTools) {
  ChatSpecialTokens tokens;
  tokens.bos_token = "<s>";
  auto chat_template = ChatTemplate::Parse(
      "{{ bos_token }}|{{ enable_thinking }}|{{ tools | tojson }}|{{ nested.a[1] }}", tokens);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  ChatRenderOptions options;
  options.extra_context_json =
      R"({"bos_token": "<custom>", "enable_thinking": false, "tools": [{"name": "f"}], "nested": {"a": [1, 2.5]}})";
  EXPECT_EQ(Render(*chat_template, {}, options), "<custom>|False|[{\"name\": \"f\"}]|2.5");
}

TEST_F(ChatTemplateTest, RefusesBadExtraContext) {
  auto chat_template = ChatTemplate::Parse("x");
  ASSERT_TRUE(chat_template.ok());
  for (const char* json : {"[1]", "{not json", R"({"messages": []})",
                           R"({"add_generation_prompt": true})", R"({"big": 99999999999999999999})"}) {
    ChatRenderOptions options;
    options.extra_context_json = json;
    EXPECT_EQ(chat_template->Render({}, options).status().code(),
              absl::StatusCode::kInvalidArgument)
        << json;
  }
}

TEST_F(ChatTemplateTest, RefusesInvalidUtf8Messages) {
  auto chat_template = ChatTemplate::Parse("{{ messages[0].content }}");
  ASSERT_TRUE(chat_template.ok());
  absl::Status status = chat_template->Render({{"user", "bad \xc3("}}, {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "message 0")) << status;
}

TEST_F(ChatTemplateTest, RaiseExceptionBecomesInvalidArgumentWithItsMessage) {
  auto chat_template = ChatTemplate::Parse(
      "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}ok");
  ASSERT_TRUE(chat_template.ok());
  absl::Status status = chat_template->Render({{"system", "s"}}, {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "template line 1: TemplateError: System role not supported");
}

TEST_F(ChatTemplateTest, ParseRefusalsNameTheConstructAndLine) {
  auto refused = ChatTemplate::Parse("{{ messages[0].content }}\n{{ x | truncate(5) }}");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "template line 2: kappa does not implement the filter 'truncate'");
}

TEST_F(ChatTemplateTest, CopiesShareTheParsedTemplate) {
  auto parsed = ChatTemplate::Parse("{% for m in messages %}[{{ m.content }}]{% endfor %}");
  ASSERT_TRUE(parsed.ok());
  const ChatTemplate copy = *parsed;
  parsed = ChatTemplate::Parse("other");
  EXPECT_EQ(Render(copy, {{"user", "a"}, {"assistant", "b"}}), "[a][b]");
}

TEST_F(ChatTemplateTest, LoadsTheTemplateStringAndAddedTokens) {
  Write("tokenizer_config.json", R"({
    "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ unk_token is defined }}",
    "bos_token": {"__type": "AddedToken", "content": "<|begin|>", "lstrip": false},
    "eos_token": "<|end|>",
    "unk_token": null
  })");
  auto chat_template = LoadChatTemplate(dir_.string());
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(Render(*chat_template, {{"user", "x"}}), "<|begin|>x<|end|>False");
  EXPECT_EQ(chat_template->special_tokens().eos_token, "<|end|>");
}

TEST_F(ChatTemplateTest, LoadsTheDefaultOfNamedTemplates) {
  Write("tokenizer_config.json", R"({"chat_template": [
    {"name": "tool_use", "template": "tools"},
    {"name": "default", "template": "default {{ messages | length }}"}]})");
  auto chat_template = LoadChatTemplate(dir_.string());
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(Render(*chat_template, {{"user", "x"}}), "default 1");
}

TEST_F(ChatTemplateTest, NamedTemplatesWithoutDefaultAreRefused) {
  Write("tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  EXPECT_EQ(LoadChatTemplate(dir_.string()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ChatTemplateTest, FallsBackToChatTemplateJinja) {
  Write("tokenizer_config.json", R"({"bos_token": "<bos>"})");
  Write("chat_template.jinja", "{{ bos_token }}\n{%- for m in messages %}\n  {{ m.role }}\n{% endfor %}\n");
  auto chat_template = LoadChatTemplate(dir_.string());
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(Render(*chat_template, {{"user", "x"}}), "<bos>  user\n");
}

TEST_F(ChatTemplateTest, NoTemplateIsNotFoundNamingTheDirectory) {
  Write("tokenizer_config.json", R"({"bos_token": "<s>", "chat_template": null})");
  absl::Status status = LoadChatTemplate(dir_.string()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(status.message(), dir_.string())) << status;
  EXPECT_EQ(LoadChatTemplate((dir_ / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ChatTemplateTest, MalformedConfigIsInvalidArgumentNamingTheFile) {
  Write("tokenizer_config.json", "{broken");
  absl::Status status = LoadChatTemplate(dir_.string()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "tokenizer_config.json")) << status;
}

TEST_F(ChatTemplateTest, UnsupportedTemplateIsRefusedAtLoadNamingTheDirectory) {
  Write("chat_template.jinja", "{% include 'x' %}");
  absl::Status status = LoadChatTemplate(dir_.string()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "kappa does not implement the tag 'include'"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), dir_.string())) << status;
}

// Every public template fixture parses (their tool-call branches included).
TEST_F(ChatTemplateTest, EveryFixtureTemplateParses) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(KAPPA_CHAT_REFERENCE_DIR) / "templates")) {
    if (!entry.is_directory()) continue;
    auto chat_template = LoadChatTemplate(entry.path().string());
    EXPECT_TRUE(chat_template.ok()) << entry.path() << ": " << chat_template.status();
    ++count;
  }
  EXPECT_GE(count, 7);
}

}  // namespace
}  // namespace kappa::tasks
