// The learner's prompts: task.prompt_template rendered and encoded with the
// student's tokenizer (a real tokenizer.json, or the character tokenizer of
// the toy models), every prompt checked at start-up naming the example, and
// a teacher with another tokenizer refused naming both files.
#include "learner/prompt_encoder.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/hf_tokenizer/hf_tokenizer.h"
#include "tasks/vector_dataset.h"

namespace kappa::learner {
namespace {

std::string Model(const std::string& name) { return std::string(KAPPA_HF_TOKENIZERS) + "/" + name; }

tasks::Example MakeExample(std::string id, std::string prompt) {
  tasks::Example example;
  example.id = std::move(id);
  example.prompt = std::move(prompt);
  example.answer = "5";
  return example;
}

TEST(PromptEncoderTest, InstructStudentGetsItsChatTemplateEncodedWithoutExtraSpecialTokens) {
  services::Config config;  // task.prompt_template: auto
  config.task.system_prompt = "Answer with a number.";
  auto encoder = PromptEncoder::ForRun(config, Model("qwen2_5"), Model("qwen2_5"));
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  const auto ids = encoder->Encode(MakeExample("train-0", "What is 2+3?"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  const auto tokenizer = model::HfTokenizer::Load(Model("qwen2_5"));
  EXPECT_EQ(*ids, tokenizer.Encode("<|im_start|>system\nAnswer with a number.<|im_end|>\n"
                                   "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
                                   "<|im_start|>assistant\n"));
  // The response's text skips special tokens, as vLLM returns it.
  std::vector<int64_t> response = tokenizer.Encode("5");
  response.push_back(*tokenizer.TokenToId("<|im_end|>"));
  EXPECT_EQ(encoder->DecodeResponse(response), "5");
}

TEST(PromptEncoderTest, ToyModelsKeepTheCharacterTokenizerWithBos) {
  services::Config config;
  auto encoder = PromptEncoder::ForRun(config, "/nonexistent/student", "/nonexistent/teacher");
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  EXPECT_EQ(*encoder->Encode(MakeExample("train-0", "12+34=")),
            model::CharTokenizer().Encode("12+34=", /*add_bos=*/true));
  EXPECT_EQ(encoder->Encode(MakeExample("x", "12+34="))->size(),
            PromptEncoder::Character().Encode(MakeExample("x", "12+34="))->size());
}

TEST(PromptEncoderTest, ATeacherWithAnotherTokenizerIsRefusedNamingBoth) {
  services::Config config;
  const auto encoder = PromptEncoder::ForRun(config, Model("qwen2_5"), Model("qwen3"));
  ASSERT_FALSE(encoder.ok());
  EXPECT_NE(encoder.status().message().find(Model("qwen2_5") + "/tokenizer.json"),
            std::string::npos)
      << encoder.status();
  EXPECT_NE(encoder.status().message().find(Model("qwen3") + "/tokenizer.json"), std::string::npos);
  // A toy student against a real teacher, too.
  EXPECT_FALSE(PromptEncoder::ForRun(config, "/nonexistent/student", Model("qwen3")).ok());
}

TEST(PromptEncoderTest, EncodeAllNamesTheFirstExampleItCannotEncode) {
  tasks::VectorDataset dataset(
      {MakeExample("train-0", "1+2="), MakeExample("train-1", "3\u20ac4=")});
  const auto all = PromptEncoder::Character().EncodeAll(dataset, "train");
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("train prompts: example train-1"), std::string::npos)
      << all.status();
  services::Config config;
  config.task.prompt_template = "Question: {prompt}";
  EXPECT_FALSE(PromptEncoder::ForRun(config, Model("llama2"), Model("llama2"))
                   ->Encode(MakeExample("x", "hi"))
                   ->empty());
  config.task.prompt_template = "chat";
  const auto no_template = PromptEncoder::ForRun(config, Model("llama2"), Model("llama2"));
  ASSERT_FALSE(no_template.ok());
  EXPECT_NE(no_template.status().message().find("task.prompt_template: chat"), std::string::npos);
}

}  // namespace
}  // namespace kappa::learner
