// A plain HTTP GET for tests that read an endpoint over a real socket (our
// /metrics, a Prometheus server's API). HTTP/1.0, so no server answers in
// chunks, and the body ends when the connection closes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace kappa::testing {

struct HttpResponse {
  int status = 0;       // 0: no connection or no parsable status line
  std::string headers;  // status line and headers
  std::string body;
};

// `address` is "IPv4:PORT".
inline HttpResponse HttpGet(const std::string& address, const std::string& path) {
  HttpResponse result;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return result;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (::inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr) != 1) return result;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return result;
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return result;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
  if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return result;
  }
  std::string response;
  char buffer[8192];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  const size_t end_of_headers = response.find("\r\n\r\n");
  if (end_of_headers == std::string::npos || response.rfind("HTTP/1.", 0) != 0) return result;
  result.headers = response.substr(0, end_of_headers);
  result.body = response.substr(end_of_headers + 4);
  const size_t space = response.find(' ');
  result.status = std::atoi(response.c_str() + space + 1);
  return result;
}

// "%XX"-escapes everything but unreserved characters, for query strings.
inline std::string UrlEncode(const std::string& text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace kappa::testing
