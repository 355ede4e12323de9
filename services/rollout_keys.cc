#include "services/rollout_keys.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kappa::services {
namespace {

absl::Status Bad(const std::string& key, const std::string& value, const std::string& allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat("config key 'rollout.", key, "': ", value, " (", allowed, ")"));
}

}  // namespace

absl::Status ValidateRolloutKeys(const Config& config) {
  const Config::Rollout& r = config.rollout;
  if (r.max_batch_rows < 0) {
    return Bad("max_batch_rows", std::to_string(r.max_batch_rows), "slots, >= 0; 0: M·G");
  }
  if (r.max_sequence_tokens < 0) {
    return Bad("max_sequence_tokens", std::to_string(r.max_sequence_tokens),
               "columns per slot, >= 0; 0: grown on demand");
  }
  if (!(r.temperature >= 0)) return Bad("temperature", std::to_string(r.temperature), ">= 0");
  if (!(r.top_p > 0 && r.top_p <= 1)) return Bad("top_p", std::to_string(r.top_p), "in (0, 1]");
  if (r.top_k < 0) return Bad("top_k", std::to_string(r.top_k), ">= 0; 0: off");
  if (!(r.min_p >= 0 && r.min_p <= 1)) return Bad("min_p", std::to_string(r.min_p), "in [0, 1]");
  if (config.learner.weight_group_workers < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key 'learner.weight_group_workers': ", config.learner.weight_group_workers,
        " (workers, >= 0; 0: no group)"));
  }
  return absl::OkStatus();
}

}  // namespace kappa::services
