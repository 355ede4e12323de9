#include "cli/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kappa::cli {

absl::StatusOr<int> PickFreePort(const std::string& host) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  const std::string ip = (host.empty() || host == "localhost") ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("host '", host, "' is not an IPv4 address (needed to pick free ports)"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("bind ", ip, ":0: ", strerror(err)));
  }
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("getsockname: ", strerror(err)));
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  int port = -1;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  return port;
}

std::string ConnectAddress(const std::string& address) {
  for (const char* wildcard : {"0.0.0.0:", "[::]:"}) {
    if (address.rfind(wildcard, 0) == 0) {
      return absl::StrCat("127.0.0.1:", address.substr(std::string(wildcard).size()));
    }
  }
  return address;
}

}  // namespace kappa::cli
