// RSTG teacher SFT, worker side (docs/algorithms.md §5.3): for a negative zero-variance
// group (every sample got reward 0) the worker asks the teacher for K
// responses to the same prompt, has the verifier check them against the same
// reference, and returns the correct ones as ScoredGroup.demonstrations; the
// learner trains the student on them with an NLL term.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kappa/v1/learner.pb.h"
#include "kappa/v1/teacher.grpc.pb.h"
#include "kappa/v1/verifier.grpc.pb.h"
#include "rollout_worker/stop_strings.h"

namespace kappa::rollout {

// Runs one RPC (`call` fills its response) under the caller's deadline,
// retry and cancellation rules; `what` names the RPC in errors.
using RpcRunner = std::function<absl::Status(
    const char* what, const std::function<grpc::Status(grpc::ClientContext*)>& call)>;

struct DemonstrationParams {
  int32_t num_samples = 0;     // K
  int64_t max_new_tokens = 0;  // the group's own limit: the learner rejects longer responses
  int64_t vocab_size = 0;      // the student's: the learner rejects ids outside it
  float temperature = 1.0f;    // as GenerateRequest: 0 means 1.0
  uint64_t seed = 0;           // 0: the teacher picks one
  TokenDecoder decode;         // the responses' text; empty: ResponseText
};

// True when the work item asks for demonstrations and the group is negative
// zero-variance (GRPO has no signal in it; the teacher's answers are one).
bool WantsDemonstrations(const kappa::v1::WorkItem& item, const kappa::v1::ScoredGroup& group);

// The Generate seed for one lease: reproducible, different per worker and per
// lease (a re-issued prompt gets a new lease, hence fresh teacher samples),
// never 0 (which would let the teacher choose).
uint64_t DemonstrationSeed(uint64_t worker_seed, const std::string& lease_id);

// Teacher.Generate K responses to the item's prompt, Verifier.Verify them
// with the item's task and reference, and return those with reward 1, in the
// teacher's order, with their decoded text. Responses the learner would
// reject (empty, too long, ids outside the vocabulary) are skipped with a
// warning. Errors: the RPC error after `run`'s retries, or INTERNAL for a
// response of the wrong size.
absl::StatusOr<std::vector<kappa::v1::TeacherDemonstration>> FetchDemonstrations(
    const kappa::v1::WorkItem& item, const DemonstrationParams& params,
    kappa::v1::Teacher::StubInterface& teacher, kappa::v1::Verifier::StubInterface& verifier,
    const RpcRunner& run);

}  // namespace kappa::rollout
