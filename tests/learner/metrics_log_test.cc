// metrics.jsonl under a full disk and after a torn write (learner/metrics_log.h).
// The full disk is a real one: a 64 KiB tmpfs mounted for the test (root
// only; skipped with the reason otherwise).
#include "learner/metrics_log.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kappa::learner {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every line of `path`, each required to be a whole JSON object.
std::vector<nlohmann::json> Records(const fs::path& path) {
  std::vector<nlohmann::json> records;
  std::istringstream lines(ReadAll(path));
  std::string line;
  while (std::getline(lines, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

// Longer than a page, so a record never fits in the tail of the last one.
nlohmann::json Record(int step) { return {{"step", step}, {"note", std::string(5000, 'x')}}; }

TEST(MetricsLogTest, CutsATornLastLineWhenReopened) {
  const fs::path path = fs::path(::testing::TempDir()) / "metrics_log_torn.jsonl";
  std::ofstream(path, std::ios::trunc) << "{\"step\": 1}\n{\"step\": 2, \"rew";
  {
    MetricsLog log(path.string());
    ASSERT_TRUE(log.Write({{"step", 2}}).ok());
  }
  EXPECT_EQ(ReadAll(path), "{\"step\": 1}\n{\"step\":2}\n");
}

class FullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
    dir_ = fs::path(::testing::TempDir()) / ("metrics_log_tmpfs_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=64k") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs: " << std::strerror(errno);
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount(dir_.c_str());
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  // Fills the file system to the last byte.
  void Fill() {
    std::ofstream filler(dir_ / "filler", std::ios::binary);
    const std::string block(512, 'f');
    while (filler.write(block.data(), block.size())) filler.flush();
  }

  fs::path dir_;
  bool mounted_ = false;
};

TEST_F(FullDiskTest, AFailedWriteLeavesWholeLinesAndTheRecordGoesOutOnceThereIsSpace) {
  const fs::path path = dir_ / "metrics.jsonl";
  MetricsLog log(path.string());
  ASSERT_TRUE(log.Write(Record(1)).ok());
  Fill();
  const absl::Status full = log.Write(Record(2));
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find(path.string()), std::string::npos) << full;
  EXPECT_NE(full.message().find(std::strerror(ENOSPC)), std::string::npos) << full;
  EXPECT_EQ(log.waiting(), 1u);
  // Nothing torn: the file still parses line by line, record 2 is not there.
  std::vector<nlohmann::json> records = Records(path);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_FALSE(log.Write(Record(3)).ok());
  EXPECT_EQ(log.waiting(), 2u);

  fs::remove(dir_ / "filler");
  ASSERT_TRUE(log.Write(Record(4)).ok());
  EXPECT_EQ(log.waiting(), 0u);
  records = Records(path);
  ASSERT_EQ(records.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(records[i]["step"], i + 1);  // in order, none lost
  EXPECT_EQ(log.dropped(), 0);
}

}  // namespace
}  // namespace kappa::learner
