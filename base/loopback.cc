#include "base/loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>

namespace kappa::base {
namespace {

bool StartsWith(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

}  // namespace

bool IsLoopbackHost(const std::string& host_text) {
  std::string host = host_text;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return host == "localhost";
}

bool IsLoopbackAddress(const std::string& address) {
  if (StartsWith(address, "unix:") || StartsWith(address, "unix-abstract:")) return true;
  std::string host = address.substr(0, address.rfind(':'));
  if (StartsWith(host, "ipv4:") || StartsWith(host, "ipv6:")) host = host.substr(5);
  return IsLoopbackHost(host);
}

}  // namespace kappa::base
