#include "learner/tensorboard_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "learner/metrics_log.h"

namespace kappa::learner {
namespace {

constexpr char kFileVersion[] = "brain.Event:2";

// Protocol buffer wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void PutTag(uint32_t field, uint32_t wire_type, std::string* out) {
  PutVarint((field << 3) | wire_type, out);
}

template <typename T>
void PutLittleEndian(T value, std::string* out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 are little-endian
  out->append(bytes, sizeof(T));
}

void PutBytes(uint32_t field, std::string_view bytes, std::string* out) {
  PutTag(field, kLengthDelimited, out);
  PutVarint(bytes.size(), out);
  out->append(bytes.data(), bytes.size());
}

// Summary.Value{tag = 1, simple_value = 2}.
std::string EncodeValue(const std::string& tag, double value) {
  std::string out;
  PutBytes(1, tag, &out);
  PutTag(2, kFixed32, &out);
  PutLittleEndian(static_cast<float>(value), &out);
  return out;
}

void FlattenInto(const std::string& prefix, const nlohmann::json& node,
                 std::vector<std::pair<std::string, double>>* out) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      FlattenInto(prefix.empty() ? key : absl::StrCat(prefix, "/", key), value, out);
    }
  } else if (node.is_boolean()) {
    out->emplace_back(prefix, node.get<bool>() ? 1.0 : 0.0);
  } else if (node.is_number()) {
    out->emplace_back(prefix, node.get<double>());
  }
}

std::string EventFileName() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  return absl::StrCat("events.out.tfevents.", seconds, ".", host, ".", getpid());
}

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<std::pair<std::string, double>> ScalarsOf(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> scalars;
  FlattenInto("", record, &scalars);
  return scalars;
}

std::string EncodeEvent(double wall_time, int64_t step, std::string_view file_version,
                        const std::vector<std::pair<std::string, double>>& scalars) {
  std::string event;
  PutTag(1, kFixed64, &event);
  PutLittleEndian(wall_time, &event);
  PutTag(2, kVarint, &event);
  PutVarint(static_cast<uint64_t>(step), &event);
  if (!file_version.empty()) {
    PutBytes(3, file_version, &event);
    return event;
  }
  std::string summary;
  for (const auto& [tag, value] : scalars) PutBytes(1, EncodeValue(tag, value), &summary);
  PutBytes(5, summary, &event);
  return event;
}

std::string FrameTfRecord(std::string_view data) {
  std::string record;
  PutLittleEndian(static_cast<uint64_t>(data.size()), &record);
  PutLittleEndian(base::MaskCrc32c(base::Crc32c(record)), &record);
  record.append(data.data(), data.size());
  PutLittleEndian(base::MaskCrc32c(base::Crc32c(data)), &record);
  return record;
}

TensorBoardLog::TensorBoardLog(const std::string& dir) : path_(dir + "/" + EventFileName()) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error(absl::StrCat(path_, ": cannot create: ", std::strerror(errno)));
  }
  if (absl::Status status = AppendWholeRecord(
          fd_, FrameTfRecord(EncodeEvent(WallTime(), 0, kFileVersion, {})), path_);
      !status.ok()) {
    throw std::runtime_error(std::string(status.message()));
  }
}

TensorBoardLog::~TensorBoardLog() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status TensorBoardLog::Write(int64_t step, const nlohmann::json& record) {
  return AppendWholeRecord(fd_, FrameTfRecord(EncodeEvent(WallTime(), step, "", ScalarsOf(record))),
                           path_);
}

}  // namespace kappa::learner
