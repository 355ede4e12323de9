#include "cli/bootstrap.h"

#include <sys/stat.h>
#include <torch/torch.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/stable_hash.h"
#include "model/checkpoint.h"
#include "model/tokenizer.h"

namespace kappa::cli {
namespace {

// A JSONL file's identity for the cache: path, size and modification time
// (editing the data retrains).
std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return absl::StrCat(path, ":missing");
  return absl::StrCat(path, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

}  // namespace

std::string BootstrapKey(const services::Config& config, learner::Role role) {
  const services::Config::Task& task = config.task;
  const services::ModelShape& shape = learner::RoleShape(config, role);
  const services::SftConfig& sft = learner::RoleBootstrap(config, role);
  // Bump the version when the SFT recipe changes in a way the settings below
  // do not capture.
  std::string text =
      absl::StrCat("kappa-bootstrap-v1|", learner::RoleName(role), "|seed=", config.seed);
  absl::StrAppend(&text, "|task=", std::string(services::ChoiceName(task.kind)), ",",
                  task.min_digits, ",", task.max_digits, ",", task.operators, ",", task.train_size,
                  ",", task.heldout_size);
  // Only when set, so the keys of held-out-first bootstraps stay what they were.
  if (task.heldout_draw != services::HeldOutDraw::kFirst) {
    absl::StrAppend(&text, ",heldout_draw=", std::string(services::ChoiceName(task.heldout_draw)));
  }
  if (task.kind == services::TaskKind::kJsonl) {
    absl::StrAppend(&text, ",", FileStamp(task.train_path), ",", FileStamp(task.heldout_path));
  }
  absl::StrAppend(&text, "|shape=", shape.hidden_size, ",", shape.intermediate_size, ",",
                  shape.num_hidden_layers, ",", shape.num_attention_heads, ",",
                  shape.num_key_value_heads, ",", shape.max_position_embeddings);
  absl::StrAppend(&text, "|sft=", sft.steps, ",", sft.batch_size, ",",
                  absl::StrFormat("%.17g,%.17g", sft.lr, sft.weight_decay), ",", sft.warmup_steps,
                  ",", sft.train_examples, ",", sft.seed);
  // Only when set, so the keys of uncorrupted bootstraps stay what they were.
  if (!sft.corrupt.empty()) absl::StrAppend(&text, "|corrupt=", sft.corrupt);
  if (sft.corrupt_fraction != 1.0) {
    absl::StrAppend(&text, "|corrupt-fraction=", absl::StrFormat("%.17g", sft.corrupt_fraction));
  }
  // Only when set too, so the keys of step-count bootstraps stay what they
  // were. The checks read trainer.eval_examples training prompts, so that
  // count is part of the key; "spread": they are spread over the split
  // (the first ones were read before, and those bootstraps stopped
  // elsewhere).
  if (sft.target_accuracy > 0) {
    absl::StrAppend(&text, "|target-spread=", absl::StrFormat("%.17g", sft.target_accuracy), ",",
                    sft.check_every, ",", config.trainer.eval_examples);
  }
  absl::StrAppend(&text, "|alphabet=", model::CharTokenizer().alphabet());
  return absl::StrFormat("%016x", base::StableHash(text));
}

std::string BootstrapDir(const services::Config& config, learner::Role role) {
  return (std::filesystem::path(config.data_dir) /
          absl::StrCat(learner::RoleName(role), "-", BootstrapKey(config, role)))
      .string();
}

absl::StatusOr<std::string> EnsureBootstrapCheckpoint(const services::Config& config,
                                                      learner::Role role, std::ostream& log) {
  const std::string role_name = learner::RoleName(role);
  const std::string& configured =
      role == learner::Role::kTeacher ? config.teacher.checkpoint : config.student.checkpoint;
  if (!configured.empty()) {
    if (!model::CheckpointExists(configured)) {
      return absl::FailedPreconditionError(
          absl::StrCat(role_name, ".checkpoint '", configured,
                       "' holds no checkpoint (config.json + model.safetensors); leave it empty to "
                       "bootstrap one by SFT"));
    }
    log << "[" << role_name << "] using configured checkpoint " << configured << "\n";
    return configured;
  }
  const std::string dir = BootstrapDir(config, role);
  if (model::CheckpointExists(dir)) {
    absl::StatusOr<learner::SftResult> summary = learner::ReadSftSummary(dir);
    if (summary.ok()) {
      log << absl::StrFormat("[%s] reusing cached SFT checkpoint %s (held-out accuracy %.3f)\n",
                             role_name, dir, summary->accuracy);
    } else {
      log << "[" << role_name << "] reusing cached SFT checkpoint " << dir << "\n";
    }
    return dir;
  }
  log << "[" << role_name << "] no cached checkpoint for this config; training one by SFT into "
      << dir << "\n"
      << std::flush;
  absl::StatusOr<learner::SftResult> result = learner::RunSft(config, role, dir, log);
  if (!result.ok()) return result.status();
  return dir;
}

}  // namespace kappa::cli
