#include "rollout_worker/teacher_demonstrations.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/stable_hash.h"
#include "rollout_worker/response_text.h"

namespace kappa::rollout {

bool WantsDemonstrations(const kappa::v1::WorkItem& item, const kappa::v1::ScoredGroup& group) {
  if (item.teacher_demonstrations() <= 0 || group.samples_size() == 0) return false;
  for (const kappa::v1::ScoredSample& sample : group.samples()) {
    if (sample.reward() != 0.0f) return false;
  }
  return true;
}

uint64_t DemonstrationSeed(uint64_t worker_seed, const std::string& lease_id) {
  const uint64_t seed =
      base::StableHash(absl::StrCat("teacher-demonstrations/", worker_seed, "/", lease_id));
  return seed == 0 ? 1 : seed;
}

absl::StatusOr<std::vector<kappa::v1::TeacherDemonstration>> FetchDemonstrations(
    const kappa::v1::WorkItem& item, const DemonstrationParams& params,
    kappa::v1::Teacher::StubInterface& teacher, kappa::v1::Verifier::StubInterface& verifier,
    const RpcRunner& run) {
  kappa::v1::GenerateRequest generate;
  *generate.mutable_prompt_tokens() = item.prompt_tokens();
  generate.set_num_samples(params.num_samples);
  generate.set_max_new_tokens(static_cast<int32_t>(params.max_new_tokens));
  generate.set_temperature(params.temperature);
  generate.set_seed(params.seed);
  kappa::v1::GenerateResponse generated;
  if (absl::Status status = run("Teacher.Generate",
                                [&](grpc::ClientContext* context) {
                                  generated.Clear();
                                  return teacher.Generate(context, generate, &generated);
                                });
      !status.ok()) {
    return status;
  }
  if (generated.samples_size() != params.num_samples) {
    return absl::InternalError(absl::StrCat("Teacher.Generate returned ",
                                            generated.samples_size(), " samples, asked for ",
                                            params.num_samples));
  }

  // Only responses the learner would accept are worth a verifier call.
  std::vector<kappa::v1::TeacherDemonstration> candidates;
  for (int i = 0; i < generated.samples_size(); ++i) {
    const google::protobuf::RepeatedField<int32_t>& tokens = generated.samples(i).tokens();
    std::string problem;
    if (tokens.empty()) {
      problem = "empty";
    } else if (tokens.size() > params.max_new_tokens) {
      problem = absl::StrCat(tokens.size(), " tokens, more than max_new_tokens ",
                             params.max_new_tokens);
    }
    for (int32_t id : tokens) {
      if (problem.empty() && (id < 0 || id >= params.vocab_size)) {
        problem = absl::StrCat("token id ", id, " outside the student vocabulary of ",
                               params.vocab_size);
      }
    }
    if (!problem.empty()) {
      spdlog::warn("lease {}: Teacher.Generate samples[{}] skipped: {}", item.lease_id(), i,
                   problem);
      continue;
    }
    kappa::v1::TeacherDemonstration& candidate = candidates.emplace_back();
    *candidate.mutable_response_tokens() = tokens;
    const std::vector<int64_t> ids(tokens.begin(), tokens.end());
    candidate.set_response_text(params.decode ? params.decode(ids) : ResponseText(ids));
  }
  if (candidates.empty()) return candidates;

  kappa::v1::VerifyRequest verify;
  for (const kappa::v1::TeacherDemonstration& candidate : candidates) {
    kappa::v1::VerifyItem* verify_item = verify.add_items();
    verify_item->set_task(item.task());
    verify_item->set_reference_answer(item.reference_answer());
    // The verifier runs a code task's tests from its own --code-tasks file
    // by this id (verifier.proto).
    verify_item->set_example_id(item.prompt_id());
    verify_item->set_response_text(candidate.response_text());
  }
  kappa::v1::VerifyResponse verified;
  if (absl::Status status = run("Verifier.Verify",
                                [&](grpc::ClientContext* context) {
                                  verified.Clear();
                                  return verifier.Verify(context, verify, &verified);
                                });
      !status.ok()) {
    return status;
  }
  if (verified.rewards_size() != static_cast<int>(candidates.size())) {
    return absl::InternalError(absl::StrCat("Verifier.Verify returned ", verified.rewards_size(),
                                            " rewards for ", candidates.size(),
                                            " teacher responses"));
  }
  std::vector<kappa::v1::TeacherDemonstration> accepted;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (verified.rewards(static_cast<int>(i)) == 1.0f) accepted.push_back(std::move(candidates[i]));
  }
  return accepted;
}

}  // namespace kappa::rollout
