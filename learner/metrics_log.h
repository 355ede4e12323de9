// metrics.jsonl: one JSON object per line, appended per step so `kappa run`'s
// progress display and later tools can tail it while training.
//
// A line is either all there or not there at all: each record goes out in
// one append, and a write that fails part-way (the disk filled up) is cut
// back off the file before Write returns. The records that could not be
// written wait, in order, and go out with the next Write that finds space
// (at most kMaxWaitingRecords wait; older ones are dropped and counted). A
// torn last line left by a crash in the middle of a write is cut off when the
// log is opened again (a resumed run), so readers never meet half a record
// followed by more data.
//
// One writer per file (the primary rank); not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kappa::learner {

// Appends all of `record` to `fd` (opened O_APPEND; `path` names it in
// messages), retrying short writes and EINTR. On failure the file is cut
// back to its size before the call, so it never ends in part of a record:
// INTERNAL when its size cannot be read, RESOURCE_EXHAUSTED naming the
// cause otherwise. Shared by metrics.jsonl and the TensorBoard event file.
absl::Status AppendWholeRecord(int fd, std::string_view record, const std::string& path);

class MetricsLog {
 public:
  // Opens `path` for appending, creating it (a resumed run continues the
  // same file); throws std::runtime_error naming the file if it cannot.
  explicit MetricsLog(const std::string& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  static constexpr size_t kMaxWaitingRecords = 4096;

  // Appends the records still waiting, then `record`, each as one line. On
  // failure (e.g. ENOSPC) the file ends after the last whole line, the
  // rest wait for the next call, and the error names the file, the cause and
  // how many wait.
  absl::Status Write(const nlohmann::json& record);

  size_t waiting() const { return waiting_.size(); }
  int64_t dropped() const { return dropped_; }  // waited too long, never written

 private:
  // Appends `line` whole or not at all.
  absl::Status AppendLine(const std::string& line);

  std::string path_;
  int fd_ = -1;
  std::deque<std::string> waiting_;  // lines not yet written, oldest first
  int64_t dropped_ = 0;
};

}  // namespace kappa::learner
