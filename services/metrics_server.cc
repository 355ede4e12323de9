#include "services/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kappa::services::metrics {
namespace {

// The content type of the text exposition format, version 0.0.4.
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// A scrape request is one line and a few headers; anything larger is not one.
constexpr size_t kMaxRequestBytes = 16 * 1024;
constexpr int kPollMillis = 200;  // how soon Stop() is noticed

// Milliseconds left until `deadline`, at least 0.
int MillisUntil(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Sends `data` unless the client stops reading: gives up at `deadline`
// (the socket is non-blocking, so a full send buffer waits in poll()).
void WriteAll(int fd, const std::string& data, std::chrono::steady_clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd ready = {fd, POLLOUT, 0};
      if (::poll(&ready, 1, MillisUntil(deadline)) <= 0) return;
      continue;
    }
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    const Registry* registry) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address,
                                                   "' is not HOST:PORT"));
  }
  const std::string host = address.substr(0, colon);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* resolved = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), nullptr, &hints, &resolved) != 0 ||
      resolved == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address,
                                                   "': cannot resolve host"));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(resolved->ai_addr);
  ::freeaddrinfo(resolved);
  addr.sin_port = htons(static_cast<uint16_t>(port));

  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 16) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", address, ": ", reason));
  }
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);

  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->listen_fd_ = fd;
  server->registry_ = registry;
  server->port_ = ntohs(addr.sin_port);
  server->address_ = absl::StrCat(host, ":", server->port_);
  server->thread_ = std::thread([raw = server.get()] { raw->Serve(); });
  return server;
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void MetricsServer::Serve() {
  while (!stop_.load()) {
    pollfd ready = {listen_fd_, POLLIN, 0};
    if (::poll(&ready, 1, kPollMillis) <= 0) continue;
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    HandleConnection(client);
    ::close(client);
  }
}

void MetricsServer::HandleConnection(int client) const {
  // One deadline for the whole exchange, reading the request head (bounded)
  // and sending the answer: a client that dribbles its request or stops
  // reading cannot hold the exporter, and the next scrape waits at most
  // kConnectionDeadline.
  const auto deadline = std::chrono::steady_clock::now() + kConnectionDeadline;
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    pollfd ready = {client, POLLIN, 0};
    if (::poll(&ready, 1, MillisUntil(deadline)) <= 0) return;
    const ssize_t n = ::recv(client, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  const bool scrape = request.rfind("GET /metrics ", 0) == 0 ||
                      request.rfind("GET /metrics?", 0) == 0;
  if (!scrape) {
    WriteAll(client, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
             deadline);
    return;
  }
  const std::string body = registry_->Serialize();
  WriteAll(client,
           absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: ", kContentType,
                        "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body),
           deadline);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetricsIfRequested(const std::string& address,
                                                                        const Registry* registry) {
  if (address.empty()) return std::unique_ptr<MetricsServer>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(address, registry);
  if (server.ok()) {
    spdlog::info("metrics on http://{}/metrics (port {})", address, (*server)->port());
  }
  return server;
}

}  // namespace kappa::services::metrics
