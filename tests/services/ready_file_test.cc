// The ready file a service writes once it listens (services/ready_file.h).
#include "services/ready_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace kappa::services {
namespace {

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(ReadyFileTest, WithPortReplacesOrAppendsThePort) {
  EXPECT_EQ(WithPort("127.0.0.1:0", 4012), "127.0.0.1:4012");
  EXPECT_EQ(WithPort("0.0.0.0:50051", 7), "0.0.0.0:7");
  EXPECT_EQ(WithPort("[::]:0", 7), "[::]:7");
  EXPECT_EQ(WithPort("[::1]", 7), "[::1]:7");
  EXPECT_EQ(WithPort("localhost", 9), "localhost:9");
}

TEST(ReadyFileTest, RoundTripsWhatWasWritten) {
  const std::string path = TempPath("ready_round_trip.json");
  std::remove(path.c_str());
  ASSERT_TRUE(WriteReadyFile(path, {42, "127.0.0.1:40123", ""}).ok());
  absl::StatusOr<ReadyInfo> info = ReadReadyFile(path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->pid, 42);
  EXPECT_EQ(info->address, "127.0.0.1:40123");
  EXPECT_EQ(info->metrics_address, "");
}

TEST(ReadyFileTest, EmptyPathWritesNothing) {
  EXPECT_TRUE(WriteReadyFile("", {1, "a:1", ""}).ok());
}

TEST(ReadyFileTest, MissingIsNotFoundAndGarbledIsDataLossNamingTheFile) {
  const std::string path = TempPath("ready_garbled.json");
  std::remove(path.c_str());
  EXPECT_TRUE(absl::IsNotFound(ReadReadyFile(path).status()));
  std::ofstream(path) << "{\"pid\": 3, \"address\": 17}";
  absl::StatusOr<ReadyInfo> info = ReadReadyFile(path);
  ASSERT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_NE(info.status().message().find(path), std::string::npos);
}

TEST(ReadyFileTest, UnwritablePathIsAnError) {
  // A regular file where the directory should be: nothing can be created there.
  const std::string not_a_directory = TempPath("ready_not_a_directory");
  std::ofstream(not_a_directory) << "x";
  EXPECT_FALSE(WriteReadyFile(not_a_directory + "/ready.json", {1, "", ""}).ok());
}

}  // namespace
}  // namespace kappa::services
