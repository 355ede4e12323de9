// task.prompt_template: chat (the model's own template, with the example's or
// the config's system message), raw, and custom text with {prompt}; and the
// errors that name the key.
#include <gtest/gtest.h>

#include <string>

#include "tasks/prompt_format.h"

namespace kappa::tasks {
namespace {

std::string Model(const std::string& name) { return std::string(KAPPA_HF_TOKENIZERS) + "/" + name; }

Example MakeExample(std::string prompt, std::string system = "") {
  Example example;
  example.id = "train-1";
  example.prompt = std::move(prompt);
  example.answer = "5";
  example.system = std::move(system);
  return example;
}

TEST(PromptFormatTest, ChatUsesTheModelsTemplateAndTheSystemMessage) {
  auto format = PromptFormat::Make("chat", "", Model("qwen2_5"));
  ASSERT_TRUE(format.ok()) << format.status();
  EXPECT_FALSE(format->add_special_tokens());
  // No system message: the template's own default (Qwen2.5's).
  EXPECT_EQ(*format->Render(MakeExample("What is 2+3?")),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n");
  auto with_system = PromptFormat::Make("chat", "Answer with a number.", Model("qwen2_5"));
  ASSERT_TRUE(with_system.ok());
  EXPECT_EQ(*with_system->Render(MakeExample("2+3?")),
            "<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // The example's own system message wins over the config's.
  EXPECT_EQ(*with_system->Render(MakeExample("2+3?", "Think step by step.")),
            "<|im_start|>system\nThink step by step.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(PromptFormatTest, ChatPassesTemplateVariables) {
  auto format = PromptFormat::Make("chat", "", Model("qwen3"), R"({"enable_thinking": false})");
  ASSERT_TRUE(format.ok()) << format.status();
  EXPECT_EQ(*format->Render(MakeExample("2+3?")),
            "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(PromptFormatTest, RawAndCustomText) {
  auto raw = PromptFormat::Make("raw", "ignored", Model("llama2"));
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_TRUE(raw->add_special_tokens());
  EXPECT_EQ(*raw->Render(MakeExample("12+34=")), "12+34=");
  auto custom = PromptFormat::Make("Question: {prompt}\nAnswer ({prompt}):", "", "");
  ASSERT_TRUE(custom.ok()) << custom.status();
  EXPECT_EQ(*custom->Render(MakeExample("1+1")), "Question: 1+1\nAnswer (1+1):");
}

TEST(PromptFormatTest, AutoIsChatWhenTheModelHasATemplateElseRaw) {
  auto instruct = PromptFormat::Make("auto", "", Model("qwen2_5"));
  ASSERT_TRUE(instruct.ok()) << instruct.status();
  EXPECT_FALSE(instruct->add_special_tokens());
  EXPECT_NE(instruct->Render(MakeExample("2+3?"))->find("<|im_start|>user\n2+3?"),
            std::string::npos);
  auto base = PromptFormat::Make("auto", "", Model("llama2"));
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_TRUE(base->add_special_tokens());
  EXPECT_EQ(*base->Render(MakeExample("2+3?")), "2+3?");
  // kappa's toy models: no tokenizer files at all.
  auto toy = PromptFormat::Make("auto", "", "/nonexistent/toy");
  ASSERT_TRUE(toy.ok()) << toy.status();
  EXPECT_EQ(*toy->Render(MakeExample("12+34=")), "12+34=");
}

TEST(PromptFormatTest, ErrorsNameTheKey) {
  const auto no_placeholder = PromptFormat::Make("Question:", "", "");
  ASSERT_FALSE(no_placeholder.ok());
  EXPECT_NE(no_placeholder.status().message().find("task.prompt_template: \"Question:\""),
            std::string::npos)
      << no_placeholder.status();
  const auto no_template = PromptFormat::Make("chat", "", Model("llama2"));
  ASSERT_FALSE(no_template.ok());
  EXPECT_NE(no_template.status().message().find("task.prompt_template: chat"), std::string::npos)
      << no_template.status();
  EXPECT_NE(no_template.status().message().find("raw"), std::string::npos);
}

}  // namespace
}  // namespace kappa::tasks
