#include "services/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace kappa::services {

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string temp = absl::StrCat(path, ".tmp-", getpid());
  {
    std::ofstream out(temp, std::ios::trunc | std::ios::binary);
    out << contents;
    out.flush();
    if (!out) {
      std::remove(temp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", temp));
    }
  }
  // The bytes reach the disk before the rename publishes them.
  const int fd = ::open(temp.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", temp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace kappa::services
