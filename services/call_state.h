// Whether a server handler's call is still wanted, for handlers that do long
// work in steps (the teacher's Generate, the verifier's code items) and
// should stop between steps once nobody waits for the answer.
#pragma once

#include <grpcpp/server_context.h>

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kappa::services {

// The call's deadline, or `if_none` when the client set none.
inline absl::Time CallDeadline(const grpc::ServerContext& context, absl::Time if_none) {
  const auto deadline = context.deadline();
  return deadline == std::chrono::system_clock::time_point::max() ? if_none
                                                                  : absl::FromChrono(deadline);
}

// OK while the call is wanted; CANCELLED once its caller went away,
// DEADLINE_EXCEEDED once `deadline` passed, each naming `call` ("Generate").
inline absl::Status CallStillWanted(const grpc::ServerContext& context, absl::Time deadline,
                                    const std::string& call) {
  if (context.IsCancelled())
    return absl::CancelledError(absl::StrCat("the caller cancelled ", call));
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat("deadline passed before ", call, " finished"));
  }
  return absl::OkStatus();
}

}  // namespace kappa::services
