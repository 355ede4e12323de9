#include "services/rpc_roles.h"

#include <array>

namespace kappa::services {
namespace {

// The methods an observer may call: health and the teacher's description.
constexpr std::array<std::string_view, 3> kObserverMethods = {
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/kappa.v1.Teacher/Info",
};

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kObserver:
      return "observer";
  }
  return "unknown";
}

std::optional<Role> RoleFromName(std::string_view name) {
  for (Role role : {Role::kWorker, Role::kObserver}) {
    if (name == RoleName(role)) return role;
  }
  return std::nullopt;
}

bool RoleMayCall(Role role, std::string_view method) {
  switch (role) {
    case Role::kWorker:
      return true;
    case Role::kObserver:
      for (std::string_view allowed : kObserverMethods) {
        if (method == allowed) return true;
      }
      return false;
  }
  return false;
}

}  // namespace kappa::services
