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

#include "base/crc32c.h"
#include "learner/tensorboard_log.h"

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
// CRC-32C's published check values: RFC 3720 B.4 (32 zero bytes, 32 0xFF
// bytes) and the catalogue's "123456789".
TEST(TensorBoardLogTest, Crc32cMatchesThePublishedCheckValues) {
  EXPECT_EQ(base::Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(base::Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(base::Crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  EXPECT_EQ(base::Crc32c("56789", base::Crc32c("1234")), 0xE3069283u);
  EXPECT_EQ(base::MaskCrc32c(0), 0xa282ead8u);
}

// The bytes of one record, derived by hand from event.proto's field
// numbers and the TFRecord layout.
TEST(TensorBoardLogTest, AnEventAndItsRecordHaveThePublishedLayout) {
  const std::string event = EncodeEvent(1.5, 3, "", {{"a", 2.0}});
  const std::string expected(
      "\x09\x00\x00\x00\x00\x00\x00\xF8\x3F"  // wall_time = 1.5
      "\x10\x03"                              // step = 3
      "\x2A\x0A"                              // summary, 10 bytes
      "\x0A\x08"                              // value, 8 bytes
      "\x0A\x01\x61"                          // tag = "a"
      "\x15\x00\x00\x00\x40",                 // simple_value = 2.0f
      23);
  EXPECT_EQ(event, expected);
  const std::string record = FrameTfRecord(event);
  ASSERT_EQ(record.size(), 8 + 4 + event.size() + 4);
  EXPECT_EQ(record.substr(0, 8), std::string("\x17\0\0\0\0\0\0\0", 8));
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length_crc, record.data() + 8, 4);
  std::memcpy(&data_crc, record.data() + 12 + event.size(), 4);
  EXPECT_EQ(length_crc, base::MaskCrc32c(base::Crc32c(record.substr(0, 8))));
  EXPECT_EQ(data_crc, base::MaskCrc32c(base::Crc32c(event)));
  EXPECT_EQ(record.substr(12, event.size()), event);
}

TEST(TensorBoardLogTest, ScalarsAreTheRecordsNumbersByTag) {
  const nlohmann::json record = {{"step", 4},
                                 {"reward_mean", 0.5},
                                 {"alarm_active", {{"collapse", 1}, {"drowning", false}}},
                                 {"lease_ids", {"a", "b"}},
                                 {"kappa", nullptr},
                                 {"name", "x"}};
  const std::vector<std::pair<std::string, double>> scalars = ScalarsOf(record);
  const std::vector<std::pair<std::string, double>> expected = {{"alarm_active/collapse", 1.0},
                                                                {"alarm_active/drowning", 0.0},
                                                                {"reward_mean", 0.5},
                                                                {"step", 4.0}};
  EXPECT_EQ(scalars, expected);  // nlohmann::json orders keys
}

TEST(TensorBoardLogTest, WritesTheFileVersionFirstThenOneRecordPerStep) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kappa-tb-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string path;
  {
    TensorBoardLog log(dir.string());
    path = log.path();
    EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
    ASSERT_TRUE(log.Write(1, {{"step", 1}, {"loss", 0.25}}).ok());
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t first_length = 0;
  std::memcpy(&first_length, bytes.data(), 8);
  const std::string first = bytes.substr(12, first_length);
  EXPECT_NE(first.find("brain.Event:2"), std::string::npos);
  const std::string second = bytes.substr(16 + first_length);
  EXPECT_EQ(second.size(), 16 + EncodeEvent(0, 1, "", {{"loss", 0.25}, {"step", 1}}).size());
  std::filesystem::remove_all(dir);
}

}  // namespace kappa::learner
