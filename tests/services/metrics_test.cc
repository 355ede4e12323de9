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

#include "tests/services/http_get.h"
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

}  // namespace
}  // namespace kappa::services::metrics
