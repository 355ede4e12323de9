#include "learner/metrics_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace kappa::learner {
namespace {

// Size of the file up to and including its last '\n' (0 if it has none).
off_t CompleteLinesSize(int fd, off_t size) {
  char byte = 0;
  for (off_t at = size; at > 0; --at) {
    if (::pread(fd, &byte, 1, at - 1) != 1) return size;  // unreadable: leave it
    if (byte == '\n') return at;
  }
  return 0;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error(
        absl::StrCat("cannot open ", path, " for appending: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || st.st_size == 0) return;
  const off_t complete = CompleteLinesSize(fd_, st.st_size);
  if (complete < st.st_size && ::ftruncate(fd_, complete) == 0) {
    spdlog::warn("{}: cut off a torn last line ({} bytes) left by an interrupted write", path,
                 st.st_size - complete);
  }
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status MetricsLog::Write(const nlohmann::json& record) {
  // NaN is not JSON; nlohmann writes it as null, which readers must accept.
  waiting_.push_back(record.dump() + "\n");
  if (waiting_.size() > kMaxWaitingRecords) {
    waiting_.pop_front();
    ++dropped_;
  }
  while (!waiting_.empty()) {
    if (absl::Status status = AppendLine(waiting_.front()); !status.ok()) {
      return absl::Status(status.code(), absl::StrCat(status.message(), "; ", waiting_.size(),
                                                      " record(s) wait for the next step"));
    }
    waiting_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status AppendWholeRecord(int fd, std::string_view record, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason = n < 0 ? std::strerror(errno) : "wrote nothing";
      const bool restored = ::ftruncate(fd, st.st_size) == 0;
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot append a record to ", path, ": ", reason,
                       restored ? "" : " (and the partial record could not be removed)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status MetricsLog::AppendLine(const std::string& line) {
  return AppendWholeRecord(fd_, line, path_);
}

}  // namespace kappa::learner
