// The metrics registry's text format against golden text and promtool, and
// the /metrics endpoint over a real socket.
#include "services/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

#include "services/metrics_server.h"
#include "tests/services/http_get.h"
#include "tests/services/promtool.h"

namespace kappa::services::metrics {
namespace {

void Fill(Registry& r) {
  r.GetCounter("kappa_test_events_total", "Events seen.\nSecond line \\ here",
               {{"kind", "a\"b\\c\nd"}})
      .Increment(3);
  r.GetCounter("kappa_test_events_total", "Events seen.\nSecond line \\ here", {{"kind", "plain"}})
      .Increment(1.5);
  Histogram& h = r.GetHistogram("kappa_test_seconds", "Durations.", {0, 0.5, 1});
  for (double v : {-1.0, 0.0, 0.25, 0.5, 2.0}) h.Observe(v);
  r.GetGauge("kappa_test_value", "A gauge.", {{"which", "nan"}})
      .Set(std::numeric_limits<double>::quiet_NaN());
  r.GetGauge("kappa_test_value", "A gauge.", {{"which", "pinf"}})
      .Set(std::numeric_limits<double>::infinity());
  r.GetGauge("kappa_test_value", "A gauge.", {{"which", "ninf"}})
      .Set(-std::numeric_limits<double>::infinity());
}

TEST(Metrics, SerializesToTheGoldenText) {
  Registry r;
  Fill(r);
  EXPECT_EQ(r.Serialize(),
            "# HELP kappa_test_events_total Events seen.\\nSecond line \\\\ here\n"
            "# TYPE kappa_test_events_total counter\n"
            "kappa_test_events_total{kind=\"a\\\"b\\\\c\\nd\"} 3\n"
            "kappa_test_events_total{kind=\"plain\"} 1.5\n"
            "# HELP kappa_test_seconds Durations.\n"
            "# TYPE kappa_test_seconds histogram\n"
            "kappa_test_seconds_bucket{le=\"0\"} 2\n"
            "kappa_test_seconds_bucket{le=\"0.5\"} 4\n"
            "kappa_test_seconds_bucket{le=\"1\"} 4\n"
            "kappa_test_seconds_bucket{le=\"+Inf\"} 5\n"
            "kappa_test_seconds_sum 1.75\n"
            "kappa_test_seconds_count 5\n"
            "# HELP kappa_test_value A gauge.\n"
            "# TYPE kappa_test_value gauge\n"
            "kappa_test_value{which=\"nan\"} NaN\n"
            "kappa_test_value{which=\"ninf\"} -Inf\n"
            "kappa_test_value{which=\"pinf\"} +Inf\n");
}

TEST(Metrics, RejectsInconsistentOrInvalidRegistrations) {
  Registry r;
  r.GetCounter("kappa_a_total", "a", {{"x", "1"}});
  EXPECT_THROW(r.GetGauge("kappa_a_total", "a", {{"x", "1"}}), std::invalid_argument);
  EXPECT_THROW(r.GetCounter("kappa_a_total", "a", {{"y", "1"}}), std::invalid_argument);
  EXPECT_THROW(r.GetCounter("9bad", "a"), std::invalid_argument);
  EXPECT_THROW(r.GetHistogram("kappa_h", "h", {1, 0.5}), std::invalid_argument);
  EXPECT_THROW(r.GetHistogram("kappa_h2", "h", {1}, {{"le", "x"}}), std::invalid_argument);
  r.GetHistogram("kappa_h3", "h", {1, 2});
  EXPECT_THROW(r.GetHistogram("kappa_h3", "h", {1, 3}), std::invalid_argument);
  // Same child twice is the same object.
  EXPECT_EQ(&r.GetCounter("kappa_a_total", "a", {{"x", "1"}}),
            &r.GetCounter("kappa_a_total", "a", {{"x", "1"}}));
}


TEST(Metrics, PromtoolFindsNothingToComplainAbout) {
  Registry r;
  Fill(r);
  const auto [status, output] = kappa::testing::PromtoolCheckMetrics(r.Serialize());
  EXPECT_EQ(status, 0) << output;
  EXPECT_EQ(output, "");
  // The check can fail: a counter without _total and no help is linted.
  Registry bad;
  bad.GetCounter("kappa_events", "");
  const auto [bad_status, bad_output] = kappa::testing::PromtoolCheckMetrics(bad.Serialize());
  EXPECT_NE(bad_output, "") << "promtool accepted a counter without _total";
  EXPECT_NE(bad_status, 127) << "promtool is not installed (scripts/setup.sh installs prometheus)";
}

TEST(Metrics, CollectHooksRunAtEveryScrapeAndTotalsNeverGoDown) {
  Registry r;
  double queue = 3;
  double total = 10;
  r.AddCollectHook([&] {
    r.GetGauge("kappa_test_queue_depth", "Waiting.").Set(queue);
    r.GetCounter("kappa_test_items_total", "Items.").SetTotal(total);
  });
  std::string text = r.Serialize();
  EXPECT_NE(text.find("kappa_test_queue_depth 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kappa_test_items_total 10\n"), std::string::npos) << text;
  queue = 0;
  total = 12;
  text = r.Serialize();
  EXPECT_NE(text.find("kappa_test_queue_depth 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kappa_test_items_total 12\n"), std::string::npos) << text;
  total = 4;  // a restarted source: the exported counter holds
  text = r.Serialize();
  EXPECT_NE(text.find("kappa_test_items_total 12\n"), std::string::npos) << text;
}

TEST(MetricsServer, ServesTheRegistryAtSlashMetrics) {
  Registry r;
  Fill(r);
  auto server = MetricsServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  const kappa::testing::HttpResponse response = kappa::testing::HttpGet(address, "/metrics");
  EXPECT_EQ(response.status, 200) << response.headers;
  EXPECT_NE(response.headers.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_EQ(response.body, r.Serialize());
  // Values are live.
  r.GetCounter("kappa_test_events_total", "Events seen.\nSecond line \\ here", {{"kind", "plain"}})
      .Increment(1);
  EXPECT_NE(kappa::testing::HttpGet(address, "/metrics")
                .body.find("kappa_test_events_total{kind=\"plain\"} 2.5"),
            std::string::npos);
  EXPECT_EQ(kappa::testing::HttpGet(address, "/other").status, 404);
}

// A connected loopback client socket to `port`; -1 on failure.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  return fd;
}

// Issue 45: one slow client cannot block scrapes. A client that dribbles its
// request a byte at a time, and one that asks for a large page and never
// reads it, each hold the (one-connection) exporter at most
// kConnectionDeadline; a scrape behind them is answered.
TEST(MetricsServer, SlowClientsCannotBlockTheNextScrape) {
  Registry r;
  Fill(r);
  for (int i = 0; i < 300000; ++i) {  // ~10 MB: more than both socket buffers hold
    r.GetGauge("kappa_test_wide", "Many series.", {{"i", std::to_string(i)}}).Set(i);
  }
  auto server = MetricsServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string address = "127.0.0.1:" + std::to_string(port);

  // Dribbles "GET /metrics" a byte every 300 ms for 30 s, never finishing.
  const int dribbler = Connect(port);
  ASSERT_GE(dribbler, 0);
  std::atomic<bool> stop{false};
  std::thread dribble([&] {
    const std::string slow = "GET /metrics HTTP/1.1\r\nX-Slow: ";
    for (int i = 0; i < 100 && !stop.load(); ++i) {
      const char byte = slow[std::min<size_t>(i, slow.size() - 1)];
      if (::send(dribbler, &byte, 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  // The dribbler connected first, so the one-connection server takes it
  // first whenever it gets to its accept().
  // HttpGet gives up after 10 s: twice the deadline, and a third of the
  // dribble, so the answer comes only if the dribbler was dropped.
  EXPECT_EQ(kappa::testing::HttpGet(address, "/metrics").status, 200)
      << "the dribbling client held the exporter";
  stop = true;
  dribble.join();
  ::close(dribbler);

  // Asks for the page with a 4 KiB receive buffer and never reads.
  const int stalled = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int small = 4096;
  ASSERT_EQ(::setsockopt(stalled, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(stalled, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(stalled, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  const kappa::testing::HttpResponse response = kappa::testing::HttpGet(address, "/metrics");
  EXPECT_EQ(response.status, 200) << "the stalled reader held the exporter";
  EXPECT_EQ(response.body.size(), r.Serialize().size());
  ::close(stalled);
}

}  // namespace
}  // namespace kappa::services::metrics
