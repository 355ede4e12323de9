// The metrics registry's text format against golden text and promtool, and
// the /metrics endpoint over a real socket.
#include "services/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "tests/services/promtool.h"

#include "services/metrics_server.h"

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

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  if (::write(fd, request.data(), request.size()) < 0) {
    ::close(fd);
    return "";
  }
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

TEST(MetricsServer, ServesTheRegistryAtSlashMetrics) {
  Registry r;
  Fill(r);
  auto server = MetricsServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string response = HttpGet((*server)->port(), "/metrics");
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  const size_t body = response.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  EXPECT_EQ(response.substr(body + 4), r.Serialize());
  // Values are live.
  r.GetCounter("kappa_test_events_total", "Events seen.\nSecond line \\ here", {{"kind", "plain"}})
      .Increment(1);
  EXPECT_NE(HttpGet((*server)->port(), "/metrics").find("kappa_test_events_total{kind=\"plain\"} 2.5"),
            std::string::npos);
  EXPECT_EQ(HttpGet((*server)->port(), "/other").find("HTTP/1.1 200"), std::string::npos);
}

}  // namespace
}  // namespace kappa::services::metrics
