// Durable file helpers for checkpoints (private to model/).
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace kappa::model::internal {

// Writes `data` to `path` (truncating) and fsyncs it before returning, so a
// later rename publishes complete bytes. Throws std::runtime_error naming the file.
void WriteFileDurably(const std::string& path, std::string_view data);
// A file written in pieces and made durable at Finish(): Append() writes
// through (no buffering beyond the kernel's); Finish() fsyncs and closes. A
// writer destroyed before Finish() closes the file, leaving it incomplete.
// Throws std::runtime_error naming the file.
class DurableFileWriter {
 public:
  explicit DurableFileWriter(const std::string& path);
  ~DurableFileWriter();
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;
  void Append(std::string_view data);
  void Finish();

 private:
  std::string path_;
  int fd_ = -1;
};

// Whole file contents; throws std::runtime_error naming the file.
std::string ReadFile(const std::string& path);
// fsync of a directory, making renames/creations inside it durable.
void SyncDirectory(const std::string& path);

// `dir` without trailing slashes ("/" stays "/").
std::string StripTrailingSlashes(std::string dir);
// Publishes a directory atomically: creates `<dir>.tmp-<pid>` (and `dir`'s
// parent), lets `write_files(tmp)` fill it (each file written durably),
// fsyncs it, then swaps it in for `dir` (renameat2 RENAME_EXCHANGE where the
// filesystem has it, so readers see the old or the new directory, never
// neither) and fsyncs the parent. On any error the temporary directory is
// removed, `dir` is left as it was, and the error propagates.
void WriteDirectoryAtomically(const std::string& dir,
                              const std::function<void(const std::string& tmp)>& write_files);

}  // namespace kappa::model::internal
