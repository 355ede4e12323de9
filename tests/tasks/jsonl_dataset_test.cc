#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tasks/dataset.h"

namespace kappa::tasks {
namespace {

class JsonlDatasetTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& contents) {
    path_ = ::testing::TempDir() + "/jsonl_dataset_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl";
    std::ofstream(path_) << contents;
    return path_;
  }
  void TearDown() override { std::remove(path_.c_str()); }

  absl::Status LoadError(const std::string& contents) {
    return LoadJsonlDataset(Write(contents)).status();
  }

  std::string path_;
};

TEST_F(JsonlDatasetTest, LoadsExamplesAndSkipsBlankLines) {
  const std::string path = Write(
      "{\"prompt\": \"1+2=\", \"answer\": \"3\"}\n"
      "\n"
      "   \n"
      "{\"prompt\": \"5-9=\", \"answer\": \"-4\", \"id\": \"custom\", \"task\": \"arithmetic\"}\n"
      "{\"prompt\": \"2*2=\", \"answer\": \"4\"}");  // no trailing newline
  auto dataset = LoadJsonlDataset(path);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ((*dataset)->size(), 3u);
  EXPECT_EQ((*dataset)->at(0).id, "jsonl-0");
  EXPECT_EQ((*dataset)->at(0).prompt, "1+2=");
  EXPECT_EQ((*dataset)->at(0).answer, "3");
  EXPECT_EQ((*dataset)->at(0).task, "arithmetic");
  EXPECT_EQ((*dataset)->at(1).id, "custom");
  EXPECT_EQ((*dataset)->at(1).answer, "-4");
  EXPECT_EQ((*dataset)->at(2).id, "jsonl-2");
}

TEST_F(JsonlDatasetTest, ErrorsNameFileAndLine) {
  struct Case {
    std::string contents;
    std::string expected;
  };
  const std::string ok = "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n";
  const Case cases[] = {
      {ok + "\n{not json\n", ":3: not valid JSON"},
      {ok + "[1, 2]\n", ":2: expected a JSON object, got array"},
      {"{\"answer\": \"2\"}\n", ":1: missing \"prompt\""},
      {ok + ok + "{\"prompt\": \"x\"}\n", ":3: missing \"answer\""},
      {"{\"prompt\": \"1+1=\", \"answer\": 2}\n", ":1: \"answer\" must be a string, got number"},
      {"{\"prompt\": \"1+1=\", \"answer\": \"two\"}\n", ":1: \"answer\": 'two' is not an integer"},
      {"{\"prompt\": \"a\", \"answer\": \"2\", \"task\": \"chess\"}\n",
       ":1: \"answer\": unknown task 'chess'"},
      {"{\"prompt\": \"a\", \"answer\": \"2\", \"id\": \"x\"}\n"
       "{\"prompt\": \"b\", \"answer\": \"3\", \"id\": \"x\"}\n",
       ":2: duplicate id 'x'"},
  };
  for (const Case& c : cases) {
    const absl::Status status = LoadError(c.contents);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.contents;
    EXPECT_EQ(std::string(status.message()).rfind(path_ + c.expected, 0), 0u)
        << "got: " << status << "\nexpected prefix: " << path_ + c.expected;
  }
}

TEST_F(JsonlDatasetTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadJsonlDataset("/nonexistent/kappa.jsonl").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kappa::tasks
