// Whether an address can only be reached from this machine: the one test the
// gRPC servers (an open non-loopback server needs client authentication)
// and the c10d group (Gloo binds loopback for a loopback store) share.
#pragma once

#include <string>

namespace kappa::base {

// `host` (an IP address, optionally in [brackets], or a name) is
// 127.0.0.0/8, ::1 or "localhost". Other names are not resolved: false.
bool IsLoopbackHost(const std::string& host);

// `address` ("host:port", "[v6]:port", "ipv4:"/"ipv6:" gRPC forms,
// "unix:...") can only be reached from this machine: a loopback host or a
// Unix socket.
bool IsLoopbackAddress(const std::string& address);

}  // namespace kappa::base
