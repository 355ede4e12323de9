// Who may call what (docs/security.md, "Roles"). A server that checks
// bearer tokens grants each caller the role of the token it presented
// (security.tokens_dir: <role>.token files), and admits a call only when
// that role may call the method:
//
//   worker    every RPC: Learner.Rollout (leases prompts, with their gold
//             answers, and returns scored groups), Learner.WatchPolicy (the
//             full weights), Learner.JoinWeightGroup, Teacher.Score,
//             Teacher.Generate, Teacher.Info, Verifier.Verify, health
//   observer  grpc.health.v1.Health (Check, Watch) and Teacher.Info only
//
// Deny by default: a method this table does not name admits workers only.
#pragma once

#include <optional>
#include <string_view>

namespace kappa::services {

enum class Role { kWorker, kObserver };

// "worker", "observer".
std::string_view RoleName(Role role);
// The role named `name` (a tokens_dir file's stem); nullopt for any other.
std::optional<Role> RoleFromName(std::string_view name);

// Whether a caller holding `role` may call `method`, a full gRPC method path
// ("/kappa.v1.Learner/WatchPolicy", as HTTP/2's :path carries it).
bool RoleMayCall(Role role, std::string_view method);

}  // namespace kappa::services
