// TensorBoard's event file of one run (logging.tensorboard): every scalar of
// every metrics.jsonl record, as TensorBoard reads it, so that
// `tensorboard --logdir runs/` draws and compares the runs (and an
// experiment's arms: each run is a directory).
//
// Format (TensorFlow's record_writer.cc and event.proto, written here from
// their published layout):
//   file   <dir>/events.out.tfevents.<unix seconds>.<host>.<pid>, a sequence
//          of TFRecords; the first holds Event{wall_time, file_version =
//          "brain.Event:2"}
//   record uint64 length (little-endian), uint32 MaskCrc32c(Crc32c of those
//          8 bytes), the data, uint32 MaskCrc32c(Crc32c of the data)
//   event  Event{wall_time = 1 (double), step = 2 (int64), summary = 5}
//          Summary{repeated value = 1}, Value{tag = 1, simple_value = 2
//          (float)}
// The tags are the record's keys; a nested object's are joined with "/"
// (alarm_active/collapse); booleans are 0/1; strings, lists and nulls are
// not scalars and are left out.
//
// Crash safety: each record goes out in one append and a failed append is
// cut back off, so the file always ends after a whole record unless the
// process dies inside write(); TensorBoard then reads up to the last whole
// record. A resumed run starts a new file beside the old one.
//
// One writer per file (the primary rank); not thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace kappa::learner {

// The scalars of one metrics record, as (tag, value) in the record's order.
std::vector<std::pair<std::string, double>> ScalarsOf(const nlohmann::json& record);

// One Event's bytes (the wire format of event.proto): wall_time, step, and
// either `file_version` (when non-empty) or a summary of `scalars`.
std::string EncodeEvent(double wall_time, int64_t step, std::string_view file_version,
                        const std::vector<std::pair<std::string, double>>& scalars);

// `data` framed as one TFRecord.
std::string FrameTfRecord(std::string_view data);

class TensorBoardLog {
 public:
  // Creates the event file in `dir` (which must exist) and writes its
  // file_version event; throws std::runtime_error naming the file if it
  // cannot.
  explicit TensorBoardLog(const std::string& dir);
  ~TensorBoardLog();
  TensorBoardLog(const TensorBoardLog&) = delete;
  TensorBoardLog& operator=(const TensorBoardLog&) = delete;

  // Appends one event at `step` with ScalarsOf(record). On failure the file
  // ends after its last whole record and the error names the file.
  absl::Status Write(int64_t step, const nlohmann::json& record);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace kappa::learner
