// A fault-injecting TCP proxy for the network fault tests: it listens on
// 127.0.0.1:<free port> and forwards every connection it accepts to one
// target, so a process pointed at address() instead of the target talks to
// it through a link the test controls. The modes switch at run time:
//
//   PassThrough()       forward everything at once (the initial mode);
//   SetLatency(d, j)    each chunk read is written no earlier than its
//                       arrival + d ± j (uniform), in each direction
//                       separately (a round trip grows by about 2·d), order
//                       kept;
//   Blackhole()         a partition: nothing is forwarded either way, the
//                       sockets stay open and what arrives is held (up to
//                       kMaxHeldBytes a direction; then the sender's own TCP
//                       buffers fill); new connections wait in the listen
//                       backlog;
//   Heal()              ends a partition: what was held is forwarded in
//                       order (latency settings kept), and waiting
//                       connections are accepted;
//   Vanish()            the peers of every connection open now disappear
//                       without a FIN or RST, as a lost node or a one-sided
//                       partition looks from either end: those connections
//                       never carry a byte again (what arrives is read and
//                       discarded, so neither end's TCP notices anything) and
//                       are closed only when both ends have closed them or
//                       the proxy is destroyed. The proxy then blackholes new
//                       connections until Heal()/PassThrough().
//
// Half-closes are forwarded in order (a FIN after the data before it); an
// error on either socket of a live connection closes both. One thread polls
// every socket; the destructor stops it and closes everything.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kappa::testing {

struct TcpFaultProxyCounters {
  int64_t connections_accepted = 0;
  int64_t connections_open = 0;
  int64_t connections_vanished = 0;  // marked by Vanish()
  int64_t bytes_to_target = 0;       // written to the target
  int64_t bytes_to_client = 0;       // written back to the clients
  int64_t bytes_held = 0;            // read, waiting for their time or for Heal()
  int64_t bytes_discarded = 0;       // read from vanished connections and dropped
};

class TcpFaultProxy {
 public:
  static constexpr size_t kMaxHeldBytes = 16 << 20;  // per direction of a connection

  // `target` is "IPv4:PORT". Throws std::runtime_error when it cannot listen.
  explicit TcpFaultProxy(const std::string& target) : target_(ParseAddress(target)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    if (listen_fd_ < 0 ||
        ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 128) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      const int err = errno;
      if (listen_fd_ >= 0) ::close(listen_fd_);
      throw std::runtime_error(std::string("TcpFaultProxy: cannot listen: ") + strerror(err));
    }
    address_ = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    thread_ = std::thread([this] { Loop(); });
  }

  ~TcpFaultProxy() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
    for (auto& connection : connections_) connection->CloseAll();
    ::close(listen_fd_);
    ::close(wake_fd_);
  }

  TcpFaultProxy(const TcpFaultProxy&) = delete;
  TcpFaultProxy& operator=(const TcpFaultProxy&) = delete;

  // Where clients connect: "127.0.0.1:PORT".
  const std::string& address() const { return address_; }

  void PassThrough() {
    Update([](Settings& s) {
      s.forwarding = true;
      s.delay = s.jitter = std::chrono::milliseconds(0);
    });
  }
  void SetLatency(std::chrono::milliseconds delay, std::chrono::milliseconds jitter) {
    Update([=](Settings& s) {
      s.delay = delay;
      s.jitter = std::min(jitter, delay);
    });
  }
  void Blackhole() {
    Update([](Settings& s) { s.forwarding = false; });
  }
  void Heal() {
    Update([](Settings& s) { s.forwarding = true; });
  }
  void Vanish() {
    Update([](Settings& s) {
      s.forwarding = false;
      ++s.vanish_epoch;
    });
  }

  TcpFaultProxyCounters counters() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Settings {
    bool forwarding = true;
    std::chrono::milliseconds delay{0};
    std::chrono::milliseconds jitter{0};
    int64_t vanish_epoch = 0;
    int64_t generation = 0;  // bumped by every change
  };

  struct Chunk {
    std::string data;
    size_t offset = 0;
    Clock::time_point due;
  };

  // One direction of a connection: bytes read from `from`, written to `to`.
  struct Direction {
    int from = -1;
    int to = -1;
    std::deque<Chunk> queue;
    size_t held = 0;
    Clock::time_point last_due;
    bool eof = false;            // `from` sent its FIN (or failed)
    bool shut = false;           // the FIN was passed on to `to`
    int64_t* written = nullptr;  // the counter for bytes written to `to`
  };

  struct Connection {
    int client = -1;
    int target = -1;
    bool vanished = false;
    bool failed = false;
    Direction up;    // client -> target
    Direction down;  // target -> client
    void CloseAll() {
      if (client >= 0) ::close(client);
      if (target >= 0) ::close(target);
      client = target = -1;
    }
  };

  static sockaddr_in ParseAddress(const std::string& address) {
    const size_t colon = address.rfind(':');
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    if (colon == std::string::npos ||
        ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
      throw std::runtime_error("TcpFaultProxy: target must be IPv4:PORT, got '" + address + "'");
    }
    addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
    return addr;
  }

  // Applies `change` and returns once the loop works with it: nothing read
  // or forwarded afterwards follows the old settings.
  template <typename F>
  void Update(F change) {
    std::unique_lock<std::mutex> lock(mu_);
    change(settings_);
    const int64_t generation = ++settings_.generation;
    Wake();
    applied_.wait(lock, [&] { return applied_generation_ >= generation; });
  }

  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  }

  void Accept() {
    while (true) {
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (client < 0) return;  // EAGAIN: the backlog is empty
      // Loopback: connect() to a listening socket completes at once; a target
      // that is down refuses, and the client sees its connection closed.
      const int target = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (target < 0 ||
          ::connect(target, reinterpret_cast<const sockaddr*>(&target_), sizeof(target_)) != 0) {
        if (target >= 0) ::close(target);
        ::close(client);
        continue;
      }
      ::fcntl(target, F_SETFL, ::fcntl(target, F_GETFL) | O_NONBLOCK);
      for (int fd : {client, target}) {
        const int on = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      }
      auto connection = std::make_unique<Connection>();
      connection->client = client;
      connection->target = target;
      connection->up.from = client;
      connection->up.to = target;
      connection->up.written = &counters_.bytes_to_target;
      connection->down.from = target;
      connection->down.to = client;
      connection->down.written = &counters_.bytes_to_client;
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.connections_accepted;
      ++counters_.connections_open;
      connections_.push_back(std::move(connection));
    }
  }

  // Reads what `d.from` has; false when the connection failed.
  bool ReadInto(Connection& c, Direction& d, const Settings& settings) {
    char buffer[64 << 10];
    while (!d.eof && (c.vanished || d.held < kMaxHeldBytes)) {
      const ssize_t n = ::recv(d.from, buffer, sizeof(buffer), 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        d.eof = true;
        return n == 0 || c.vanished;  // an error (RST) on a live connection fails it
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (c.vanished) {
        counters_.bytes_discarded += n;
        continue;
      }
      Chunk chunk;
      chunk.data.assign(buffer, static_cast<size_t>(n));
      auto delay = settings.delay;
      if (settings.jitter.count() > 0) {
        std::uniform_int_distribution<int64_t> spread(-settings.jitter.count(),
                                                      settings.jitter.count());
        delay += std::chrono::milliseconds(spread(random_));
      }
      chunk.due = std::max(Clock::now() + delay, d.last_due);  // order kept
      d.last_due = chunk.due;
      d.held += chunk.data.size();
      counters_.bytes_held += n;
      d.queue.push_back(std::move(chunk));
    }
    return true;
  }

  // Writes the chunks that are due; false when the connection failed.
  bool WriteDue(Direction& d, Clock::time_point now) {
    while (!d.queue.empty() && d.queue.front().due <= now) {
      Chunk& chunk = d.queue.front();
      const ssize_t n = ::send(d.to, chunk.data.data() + chunk.offset,
                               chunk.data.size() - chunk.offset, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return false;
      chunk.offset += static_cast<size_t>(n);
      d.held -= static_cast<size_t>(n);
      {
        std::lock_guard<std::mutex> lock(mu_);
        *d.written += n;
        counters_.bytes_held -= n;
      }
      if (chunk.offset == chunk.data.size()) d.queue.pop_front();
    }
    if (d.queue.empty() && d.eof && !d.shut) {
      ::shutdown(d.to, SHUT_WR);
      d.shut = true;
    }
    return true;
  }

  void Loop() {
    int64_t vanish_epoch = 0;
    while (true) {
      Settings settings;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        settings = settings_;
        applied_generation_ = settings.generation;
      }
      applied_.notify_all();
      if (settings.vanish_epoch != vanish_epoch) {
        vanish_epoch = settings.vanish_epoch;
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& c : connections_) {
          if (c->vanished) continue;
          c->vanished = true;
          ++counters_.connections_vanished;
          for (Direction* d : {&c->up, &c->down}) {
            counters_.bytes_discarded += static_cast<int64_t>(d->held);
            counters_.bytes_held -= static_cast<int64_t>(d->held);
            d->queue.clear();
            d->held = 0;
          }
        }
      }
      const auto now = Clock::now();
      // Forward what is due, pass FINs on, and retire finished connections.
      for (auto it = connections_.begin(); it != connections_.end();) {
        Connection& c = **it;
        if (!c.vanished && settings.forwarding && !c.failed) {
          c.failed = !WriteDue(c.up, now) || !WriteDue(c.down, now);
        }
        const bool done =
            c.failed || (c.vanished ? c.up.eof && c.down.eof : c.up.shut && c.down.shut);
        if (done) {
          c.CloseAll();
          {
            std::lock_guard<std::mutex> lock(mu_);
            --counters_.connections_open;
            counters_.bytes_held -= static_cast<int64_t>(c.up.held + c.down.held);
          }
          it = connections_.erase(it);
        } else {
          ++it;
        }
      }

      std::vector<pollfd> fds;
      std::vector<std::pair<Connection*, Direction*>> owners;  // per fd after the first two
      fds.push_back({wake_fd_, POLLIN, 0});
      fds.push_back({listen_fd_, static_cast<short>(settings.forwarding ? POLLIN : 0), 0});
      auto wait = std::chrono::milliseconds(200);
      for (auto& c : connections_) {
        for (Direction* d : {&c->up, &c->down}) {
          short events = 0;
          if (!d->eof && (c->vanished || d->held < kMaxHeldBytes)) events |= POLLIN;
          if (!c->vanished && settings.forwarding && !d->queue.empty()) {
            if (d->queue.front().due <= now) {
              events |= POLLOUT;
            } else {
              wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(
                                        d->queue.front().due - now) +
                                        std::chrono::milliseconds(1));
            }
          }
          // Reading and writing a direction use different sockets: poll the
          // source for input and the destination for output.
          if (events & POLLIN) {
            fds.push_back({d->from, POLLIN, 0});
            owners.emplace_back(c.get(), d);
          }
          if (events & POLLOUT) {
            fds.push_back({d->to, POLLOUT, 0});
            owners.emplace_back(c.get(), d);
          }
        }
      }
      ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
      if (fds[0].revents & POLLIN) {
        uint64_t value;
        [[maybe_unused]] ssize_t ignored = ::read(wake_fd_, &value, sizeof(value));
      }
      if (fds[1].revents & POLLIN) Accept();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto [c, d] = owners[i - 2];
        if (c->failed) continue;
        if (fds[i].events & POLLIN) {
          if (!ReadInto(*c, *d, settings)) c->failed = true;
        } else if (!WriteDue(*d, Clock::now())) {
          c->failed = true;
        }
      }
    }
  }

  const sockaddr_in target_;
  std::string address_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::list<std::unique_ptr<Connection>> connections_;  // the loop thread's

  mutable std::mutex mu_;
  std::condition_variable applied_;
  Settings settings_;               // guarded by mu_
  int64_t applied_generation_ = 0;  // guarded by mu_: the settings the loop works with
  bool stop_ = false;               // guarded by mu_
  TcpFaultProxyCounters counters_;  // guarded by mu_
  std::mt19937_64 random_{20240611};
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace kappa::testing
