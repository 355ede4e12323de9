#include "model/file_io.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace kappa::model::internal {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void Fail(const std::string& action, const std::string& path) {
  throw std::runtime_error(action + " " + path + ": " + std::strerror(errno));
}

[[noreturn]] void FailErrno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

// Swaps the filled `tmp` in for `dir`, then makes the rename durable.
void PublishDirectory(const std::string& tmp, const std::string& dir, const fs::path& parent) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0) FailErrno("cannot rename " + tmp + " to " + dir);
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    // Readers see either the old or the new directory, never neither;
    // the old one now sits at `tmp`.
    fs::remove_all(tmp);
  } else {
    // Filesystems without RENAME_EXCHANGE: a short window without `dir`.
    const std::string old = dir + ".old-" + std::to_string(::getpid());
    fs::remove_all(old);
    if (::rename(dir.c_str(), old.c_str()) != 0) FailErrno("cannot move aside " + dir);
    if (::rename(tmp.c_str(), dir.c_str()) != 0) FailErrno("cannot rename " + tmp + " to " + dir);
    fs::remove_all(old);
  }
  SyncDirectory(parent.string());
}

}  // namespace

DurableFileWriter::DurableFileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) Fail("cannot create", path);
}

DurableFileWriter::~DurableFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void DurableFileWriter::Append(std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Fail("cannot write", path_);
    }
    done += static_cast<size_t>(n);
  }
}

void DurableFileWriter::Finish() {
  if (::fsync(fd_) != 0) Fail("cannot fsync", path_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) Fail("cannot close", path_);
}

void WriteFileDurably(const std::string& path, std::string_view data) {
  DurableFileWriter writer(path);
  writer.Append(data);
  writer.Finish();
}

std::string ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    Fail("cannot stat", path);
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      Fail("cannot read", path);
    }
    if (n == 0) break;  // file shrank underneath us
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  ::close(fd);
  return data;
}

void SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) Fail("cannot open directory", path);
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) Fail("cannot fsync directory", path);
}

std::string StripTrailingSlashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

void WriteDirectoryAtomically(const std::string& dir_in,
                              const std::function<void(const std::string& tmp)>& write_files) {
  const std::string dir = StripTrailingSlashes(dir_in);
  fs::path parent = fs::path(dir).parent_path();
  if (parent.empty()) parent = ".";
  fs::create_directories(parent);
  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  try {
    write_files(tmp);
    SyncDirectory(tmp);
    PublishDirectory(tmp, dir, parent);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

}  // namespace kappa::model::internal
