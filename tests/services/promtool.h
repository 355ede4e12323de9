// `promtool check metrics` on a scrape, for the tests that prove our
// exposition text (Debian's prometheus package, installed by setup.sh).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

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

}  // namespace kappa::testing
