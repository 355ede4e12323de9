// For the tests that prove our exposition text: `promtool check metrics` on a
// scrape (Debian's prometheus package, installed by setup.sh), and reading
// one sample's value back.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

namespace kappa::testing {

// Returns (exit status, everything promtool printed); 127: not installed.
inline std::pair<int, std::string> PromtoolCheckMetrics(const std::string& text) {
  char path[] = "/tmp/kappa_promtool_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {-1, "mkstemp failed"};
  ::close(fd);
  std::ofstream(path) << text;
  const std::string command = std::string("promtool check metrics < ") + path + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  std::remove(path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// The value of the sample `series` (name plus label text exactly as
// serialized, e.g. `kappa_x_total{kind="a"}`) in a scrape; NaN if absent.
inline double SampleValue(const std::string& scrape, const std::string& series) {
  const std::string needle = "\n" + series + " ";
  const std::string text = "\n" + scrape;
  const size_t at = text.find(needle);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + at + needle.size(), nullptr);
}

}  // namespace kappa::testing
