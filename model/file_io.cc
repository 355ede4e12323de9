#include "model/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace kappa::model::internal {
namespace {

[[noreturn]] void Fail(const std::string& action, const std::string& path) {
  throw std::runtime_error(action + " " + path + ": " + std::strerror(errno));
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

}  // namespace kappa::model::internal
