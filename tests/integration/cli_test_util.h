// Helpers for the tests that run the `kappa` binary.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
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

#ifdef KAPPA_BIN
// What a `kappa` run fed on stdin printed, stdout split into lines.
struct LinesResult {
  int exit_code = -1;
  std::vector<std::string> lines;  // stdout
  std::string errors;              // stderr
};

// Runs KAPPA_BIN with `args`, `input` on stdin.
inline LinesResult RunKappaWithInput(const std::vector<std::string>& args,
                                     const std::string& input) {
  const std::string dir = MakeTempDir("kappa_cli_stdin");
  WriteFile(dir + "/in", input);
  std::string command = ShellQuote(KAPPA_BIN);
  for (const std::string& arg : args) command += " " + ShellQuote(arg);
  command += " <" + dir + "/in >" + dir + "/out 2>" + dir + "/err";
  LinesResult result;
  const int status = std::system(command.c_str());
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream out(dir + "/out");
  for (std::string line; std::getline(out, line);) result.lines.push_back(line);
  std::ifstream err(dir + "/err");
  result.errors.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  return result;
}
#endif  // KAPPA_BIN

}  // namespace kappa::cli::testing
