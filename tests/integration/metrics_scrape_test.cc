// Every process of a real `kappa run` (teacher, verifier, learner, two
// rollout workers; real processes on loopback) is scraped while it trains:
//   * each /metrics passes `promtool check metrics` with no complaint and
//     carries only its own service's families;
//   * every metric the alert rules and the Grafana dashboard query is
//     declared by some live scrape (names from deploy/tools/metric_names.py);
//   * a real Prometheus server (Debian's package) started with the run's own
//     prometheus.yml and our rules scrapes all five targets, loads every
//     rule group healthy, and answers κ through its HTTP API with a value
//     the learner logged in metrics.jsonl.
// One run serves all three tests; it is killed with SIGTERM at the end.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/process_supervisor.h"
#include "tests/integration/run_files.h"
#include "tests/integration/tiny_run_config.h"
#include "tests/services/http_get.h"
#include "tests/services/promtool.h"

namespace {

namespace fs = std::filesystem;
using kappa::cli::ProcessSpec;
using kappa::cli::ProcessSupervisor;
using kappa::testing::HttpGet;
using kappa::testing::ReadAll;
using kappa::testing::StepRecords;

std::string RunCommand(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  if (pipe != nullptr) pclose(pipe);
  return output;
}

struct Target {
  std::string job;
  std::string address;
};

// The targets of the run's prometheus.yml (as `kappa run` writes it: one
// job_name line, then `- targets: ["host:port"]` lines).
std::vector<Target> ParseTargets(const std::string& yaml) {
  std::vector<Target> targets;
  std::string job;
  std::istringstream in(yaml);
  std::string line;
  std::smatch match;
  while (std::getline(in, line)) {
    if (std::regex_search(line, match, std::regex(R"(job_name:\s*(\S+))"))) job = match[1];
    if (std::regex_search(line, match, std::regex(R"re(targets:\s*\["([^"]+)"\])re"))) {
      targets.push_back({job, match[1]});
    }
  }
  return targets;
}

// Family names declared by `# TYPE` lines.
std::set<std::string> Families(const std::string& scrape) {
  std::set<std::string> names;
  std::istringstream in(scrape);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) names.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  return names;
}

class MetricsScrapeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("kappa-scrape-" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    const fs::path config = root_ / "scrape.yaml";
    // Far more steps than the test waits for: the run is stopped by SIGTERM.
    std::ofstream(config) << kappa::testing::TinyRunConfig(
        "scrape", root_.string(), 2,
        "{steps: 100000, groups_per_step: 2, group_size: 4, eval_every: 2, eval_examples: 10,\n"
        "          checkpoint_every: 0}");
    ProcessSpec kappa_run;
    kappa_run.name = "kappa-run";
    kappa_run.argv = {KAPPA_CLI, "run", config.string(), "--no-progress"};
    kappa_run.log_file = (root_ / "kappa.out").string();
    supervisor_ = new ProcessSupervisor();
    auto pid = supervisor_->Spawn(kappa_run);
    ASSERT_TRUE(pid.ok()) << pid.status();
    kappa_run_pid_ = *pid;

    // Until the learner has trained and evaluated, so every family it
    // exports has been set at least once.
    run_dir_ = root_ / "runs" / "scrape";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    while (std::chrono::steady_clock::now() < deadline) {
      ASSERT_TRUE(supervisor_->Poll().empty())
          << "kappa run exited early:\n" << ReadAll(root_ / "kappa.out");
      const std::vector<nlohmann::json> records = StepRecords(run_dir_ / "metrics.jsonl");
      bool evaluated_after_training = false;
      for (const nlohmann::json& r : records) {
        if (r.value("step", 0) >= 2 && r.contains("eval_accuracy")) evaluated_after_training = true;
      }
      // prometheus.yml lists every process once the workers have reported.
      if (evaluated_after_training && records.size() >= 4 &&
          ParseTargets(ReadAll(run_dir_ / "prometheus.yml")).size() == 5) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    targets_ = ParseTargets(ReadAll(run_dir_ / "prometheus.yml"));
  }

  static void TearDownTestSuite() {
    if (supervisor_ != nullptr) {
      supervisor_->StopAll(std::chrono::seconds(15));
      delete supervisor_;
      supervisor_ = nullptr;
    }
    fs::remove_all(root_);
  }

  void SetUp() override {
    ASSERT_TRUE(fs::exists(run_dir_ / "prometheus.yml")) << ReadAll(root_ / "kappa.out");
    ASSERT_EQ(targets_.size(), 5u) << ReadAll(run_dir_ / "prometheus.yml");
  }

  static fs::path root_;
  static fs::path run_dir_;
  static ProcessSupervisor* supervisor_;
  static pid_t kappa_run_pid_;
  static std::vector<Target> targets_;
};

fs::path MetricsScrapeTest::root_;
fs::path MetricsScrapeTest::run_dir_;
ProcessSupervisor* MetricsScrapeTest::supervisor_ = nullptr;
pid_t MetricsScrapeTest::kappa_run_pid_ = 0;
std::vector<Target> MetricsScrapeTest::targets_;

TEST_F(MetricsScrapeTest, EveryProcessServesCleanMetricsOfItsOwnService) {
  const std::map<std::string, std::string> prefix = {{"kappa-learner", "kappa_learner_"},
                                                     {"kappa-teacher", "kappa_teacher_"},
                                                     {"kappa-verifier", "kappa_verifier_"},
                                                     {"kappa-rollout", "kappa_worker_"}};
  std::map<std::string, int> per_job;
  for (const Target& target : targets_) {
    SCOPED_TRACE(target.job + " at " + target.address);
    ++per_job[target.job];
    const kappa::testing::HttpResponse response = HttpGet(target.address, "/metrics");
    ASSERT_EQ(response.status, 200) << response.headers;
    const auto [status, complaints] = kappa::testing::PromtoolCheckMetrics(response.body);
    EXPECT_EQ(status, 0) << complaints;
    EXPECT_EQ(complaints, "") << response.body;
    const std::set<std::string> families = Families(response.body);
    EXPECT_GE(families.size(), 4u) << response.body;
    for (const std::string& family : families) {
      EXPECT_EQ(family.rfind(prefix.at(target.job), 0), 0u) << family;
    }
  }
  EXPECT_EQ(per_job, (std::map<std::string, int>{{"kappa-learner", 1},
                                                  {"kappa-rollout", 2},
                                                  {"kappa-teacher", 1},
                                                  {"kappa-verifier", 1}}));
}

TEST_F(MetricsScrapeTest, EveryMetricTheRulesAndDashboardQueryExists) {
  std::set<std::string> scraped;
  for (const Target& target : targets_) {
    const std::set<std::string> families = Families(HttpGet(target.address, "/metrics").body);
    scraped.insert(families.begin(), families.end());
  }
  const fs::path source = KAPPA_SOURCE_DIR;
  const std::string used = RunCommand(
      "python3 " + (source / "deploy/tools/metric_names.py").string() + " --families " +
      (source / "deploy/prometheus/rules.yml").string() + " " +
      (source / "deploy/grafana/dashboards/kappa.json").string());
  std::istringstream names(used);
  std::string name;
  int checked = 0;
  while (std::getline(names, name)) {
    if (name.empty()) continue;
    ++checked;
    EXPECT_TRUE(scraped.count(name)) << name << " is queried by the rules or the dashboard "
                                        "but no process exports it";
  }
  EXPECT_GE(checked, 20) << "metric_names.py printed:\n" << used;
}

// Where Prometheus listens once it does: HOST:PORT from its log line
// `msg="Listening on" address=HOST:PORT` (the port it bound for port 0);
// "" if no such line appears within `timeout`.
std::string AwaitListeningAddress(const fs::path& log, std::chrono::seconds timeout) {
  const std::regex listening("msg=\"Listening on\" address=([0-9.]+:[0-9]+)");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch match;
    const std::string text = ReadAll(log);
    if (std::regex_search(text, match, listening)) return match[1];
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

TEST_F(MetricsScrapeTest, PrometheusScrapesTheRunAndAnswersKappa) {
  // The run's own scrape config, faster, plus our alerting rules.
  const fs::path prometheus_dir = root_ / "prometheus";
  fs::create_directories(prometheus_dir / "data");
  std::string config = ReadAll(run_dir_ / "prometheus.yml");
  config = std::regex_replace(config, std::regex("scrape_interval: 5s"), "scrape_interval: 1s");
  config = std::regex_replace(config, std::regex("evaluation_interval: 5s"),
                              "evaluation_interval: 1s");
  config += "rule_files:\n  - " + (fs::path(KAPPA_SOURCE_DIR) / "deploy/prometheus/rules.yml").string() +
            "\n";
  std::ofstream(prometheus_dir / "prometheus.yml") << config;
  // Port 0, and the port it bound from its log (no port picked here for
  // Prometheus to bind later).
  ProcessSpec prometheus;
  prometheus.name = "prometheus";
  prometheus.argv = {"/usr/bin/prometheus",
                     "--config.file=" + (prometheus_dir / "prometheus.yml").string(),
                     "--storage.tsdb.path=" + (prometheus_dir / "data").string(),
                     "--web.listen-address=127.0.0.1:0"};
  prometheus.log_file = (prometheus_dir / "prometheus.log").string();
  ASSERT_TRUE(supervisor_->Spawn(prometheus).ok());
  const std::string address =
      AwaitListeningAddress(prometheus_dir / "prometheus.log", std::chrono::seconds(30));
  ASSERT_FALSE(address.empty()) << ReadAll(prometheus_dir / "prometheus.log");

  auto query = [&](const std::string& promql) {
    const auto response =
        HttpGet(address, "/api/v1/query?query=" + kappa::testing::UrlEncode(promql));
    if (response.status != 200) return nlohmann::json();
    return nlohmann::json::parse(response.body, nullptr, false)["data"]["result"];
  };
  // Until every target has been scraped up and κ is stored (a few scrapes).
  nlohmann::json kappa;
  nlohmann::json up;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    up = query("sum(up)");
    kappa = query("kappa_learner_grad_norm_ratio");
    if (up.is_array() && up.size() == 1 && up[0]["value"][1] == "5" && kappa.is_array() &&
        kappa.size() == 1) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_TRUE(kappa.is_array() && kappa.size() == 1)
      << kappa.dump() << "\n" << ReadAll(prometheus_dir / "prometheus.log");
  ASSERT_EQ(up[0]["value"][1], "5") << "not every process was scraped up: " << up.dump();
  EXPECT_EQ(kappa[0]["metric"]["job"], "kappa-learner");

  // The κ Prometheus holds is one the learner logged for some step.
  const double served = std::stod(kappa[0]["value"][1].get<std::string>());
  bool logged = false;
  for (const nlohmann::json& record : StepRecords(run_dir_ / "metrics.jsonl")) {
    if (record.contains("kappa") && record["kappa"].is_number() &&
        std::fabs(record["kappa"].get<double>() - served) <= 1e-6 * std::fabs(served)) {
      logged = true;
    }
  }
  EXPECT_TRUE(logged) << "Prometheus has kappa = " << served
                      << ", which no line of metrics.jsonl logged";

  // Worker series from both workers, told apart by instance alone.
  const nlohmann::json tokens = query("kappa_worker_tokens_total");
  ASSERT_TRUE(tokens.is_array());
  EXPECT_EQ(tokens.size(), 2u) << tokens.dump();

  // Every rule group loaded and evaluated without error.
  const auto rules = HttpGet(address, "/api/v1/rules");
  ASSERT_EQ(rules.status, 200);
  const nlohmann::json groups = nlohmann::json::parse(rules.body)["data"]["groups"];
  ASSERT_GE(groups.size(), 3u) << rules.body;
  for (const nlohmann::json& group : groups) {
    for (const nlohmann::json& rule : group["rules"]) {
      EXPECT_EQ(rule["health"], "ok") << group["name"] << "/" << rule["name"] << ": " << rule.dump();
    }
  }
}

}  // namespace
