// A throwaway PKI for TLS tests, made with the `openssl` command line: a CA,
// a server certificate for 127.0.0.1/localhost, a client certificate, and a
// second, untrusted CA with a client certificate of its own.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace kappa::testing {

struct TestPki {
  std::string dir;
  std::string Path(const std::string& name) const { return dir + "/" + name; }
  // Files: ca.crt, server.{crt,key}, client.{crt,key}, node.{crt,key} (one
  // certificate for both sides, as `kappa run` gives every process),
  // rogue-ca.crt, rogue-client.{crt,key}.
};

inline std::string ReadPkiFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Empty dir on failure (the caller asserts); openssl's output goes to
// dir/openssl.log.
inline TestPki MakeTestPki(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/openssl.log";
  // EC keys: generating them takes milliseconds, RSA ones much longer.
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  auto run = [&](const std::string& command) {
    return std::system(absl::StrCat("cd '", dir, "' && ", command, " >>'", log, "' 2>&1").c_str()) == 0;
  };
  auto make_ca = [&](const std::string& name) {
    return run(absl::StrCat("openssl req -x509 ", key, " -keyout ", name, ".key -out ", name,
                            ".crt -days 2 -subj /CN=", name));
  };
  auto make_leaf = [&](const std::string& name, const std::string& ca,
                       const std::string& extensions) {
    std::ofstream(dir + "/" + name + ".ext") << extensions << "\n";
    return run(absl::StrCat("openssl req ", key, " -keyout ", name, ".key -out ", name,
                            ".csr -subj /CN=", name)) &&
           run(absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ", ca, ".crt -CAkey ", ca,
                            ".key -CAcreateserial -days 2 -out ", name, ".crt -extfile ", name,
                            ".ext"));
  };
  const bool ok =
      make_ca("ca") && make_ca("rogue-ca") &&
      make_leaf("server", "ca",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth") &&
      make_leaf("client", "ca", "extendedKeyUsage=clientAuth") &&
      make_leaf("node", "ca",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "extendedKeyUsage=serverAuth,clientAuth") &&
      make_leaf("rogue-client", "rogue-ca", "extendedKeyUsage=clientAuth");
  return TestPki{ok ? dir : ""};
}

}  // namespace kappa::testing
