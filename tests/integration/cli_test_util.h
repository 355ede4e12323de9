// Helpers for the tests that run the `kappa` binary.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kappa::cli::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline std::string ShellQuote(const std::string& arg) {
  std::string quoted = "'";
  for (char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

#ifdef KAPPA_BIN
// Runs KAPPA_BIN (the built `kappa`, set by CMake) with `args` (stdin from
// /dev/null).
inline CommandResult RunKappa(const std::vector<std::string>& args) {
  std::string command = ShellQuote(KAPPA_BIN);
  for (const std::string& arg : args) command += " " + ShellQuote(arg);
  command += " </dev/null 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}
#endif  // KAPPA_BIN

inline std::string MakeTempDir(const std::string& prefix) {
  std::string templ = "/tmp/" + prefix + "_XXXXXX";
  std::vector<char> buffer(templ.begin(), templ.end());
  buffer.push_back('\0');
  const char* dir = mkdtemp(buffer.data());
  return dir == nullptr ? std::string() : std::string(dir);
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kappa::cli::testing
