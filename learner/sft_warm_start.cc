#include "learner/sft_warm_start.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "learner/algo/sft.h"
#include "learner/dataset_accuracy.h"
#include "model/checkpoint.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "services/atomic_file.h"
#include "tasks/answer_corruption.h"
#include "tasks/dataset_sample.h"
#include "tasks/from_config.h"
#include "tasks/vector_dataset.h"

namespace kappa::learner {
namespace {

model::ModelConfig DecoderConfig(const services::ModelShape& shape, Role role,
                                 const model::CharTokenizer& tokenizer) {
  model::ModelConfig config;
  config.name = absl::StrCat("kappa-", RoleName(role));
  config.vocab_size = tokenizer.vocab_size();
  config.hidden_size = shape.hidden_size;
  config.intermediate_size = shape.intermediate_size;
  config.num_hidden_layers = shape.num_hidden_layers;
  config.num_attention_heads = shape.num_attention_heads;
  config.num_key_value_heads = shape.num_key_value_heads;
  config.max_position_embeddings = shape.max_position_embeddings;
  config.bos_token_id = model::CharTokenizer::kBos;
  config.eos_token_ids = {model::CharTokenizer::kEos};
  config.pad_token_id = model::CharTokenizer::kPad;
  return config;
}

void WriteSummary(const std::string& dir, Role role, const SftResult& result) {
  nlohmann::json summary = {
      {"role", RoleName(role)},
      {"accuracy", result.accuracy},
      {"accuracy_before", result.accuracy_before},
      {"train_accuracy", result.train_accuracy},
      {"loss", result.loss},
      {"steps", result.steps},
      {"seconds", result.seconds},
      {"train_examples", result.train_examples},
      {"eval_examples", result.eval_examples},
  };
  if (result.target_accuracy > 0) {
    summary["target_accuracy"] = result.target_accuracy;
    summary["reached_target"] = result.reached_target;
  }
  if (!result.corrupt.empty()) {
    auto number_or_null = [](const std::optional<double>& x) {
      return x ? nlohmann::json(*x) : nlohmann::json(nullptr);
    };
    summary["corrupt"] = result.corrupt;
    summary["corrupt_fraction"] = result.corrupt_fraction;
    summary["corrupted_train_examples"] = result.corrupted_train_examples;
    summary["covered_accuracy"] = number_or_null(result.covered_accuracy);
    summary["covered_corrupt_agreement"] = number_or_null(result.covered_corrupt_agreement);
    summary["rest_accuracy"] = number_or_null(result.rest_accuracy);
  }
  const absl::Status written =
      services::WriteFileAtomically(dir + "/" + kSftSummaryFile, summary.dump(2) + "\n");
  if (!written.ok()) throw std::runtime_error(std::string(written.message()));
}

// The first `count` held-out examples split by `rule`: those it covers
// (with their true answers, and again with the rule's answers) and the rest.
struct CorruptionSplit {
  tasks::VectorDataset covered, covered_as_corrupted, rest;
};

CorruptionSplit SplitByCorruption(const tasks::Dataset& dataset, size_t count,
                                  const tasks::AnswerCorruption& rule) {
  std::vector<tasks::Example> covered, covered_as_corrupted, rest;
  for (size_t i = 0; i < std::min(count, dataset.size()); ++i) {
    const tasks::Example& example = dataset.at(i);
    if (!rule.Covers(example)) {
      rest.push_back(example);
      continue;
    }
    covered.push_back(example);
    tasks::Example wrong = example;
    wrong.answer = rule.AnswerFor(example);
    covered_as_corrupted.push_back(std::move(wrong));
  }
  return {tasks::VectorDataset(std::move(covered)),
          tasks::VectorDataset(std::move(covered_as_corrupted)),
          tasks::VectorDataset(std::move(rest))};
}

// bootstrap.corrupt and corrupt_fraction as they are used: nullopt without
// a rule; INVALID_ARGUMENT naming the key for an unknown rule, a fraction
// outside (0, 1], or a fraction below 1 without a rule.
absl::StatusOr<std::optional<tasks::AnswerCorruption>> ParseCorruption(
    const services::SftConfig& sft, const std::string& role_name) {
  if (!(sft.corrupt_fraction > 0.0 && sft.corrupt_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", role_name,
                     ".bootstrap.corrupt_fraction': ", sft.corrupt_fraction, " is not in (0, 1]"));
  }
  if (sft.corrupt.empty() && sft.corrupt_fraction != 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", role_name, ".bootstrap.corrupt_fraction' is ",
                     sft.corrupt_fraction, " but '", role_name, ".bootstrap.corrupt' is empty"));
  }
  return tasks::AnswerCorruption::FromConfigKey(absl::StrCat(role_name, ".bootstrap.corrupt"),
                                                sft.corrupt);
}

// The first `count` examples of `train`, encoded. An example `corruption`
// covers (when given) gets the rule's wrong answer with draw weight
// `fraction` and, when fraction < 1, a twin with its true answer and weight
// 1 − fraction, so that each prompt is drawn as often as any other.
// *corrupted counts the covered examples.
std::vector<SftExample> BuildSftExamples(const tasks::Dataset& train, size_t count,
                                         const tasks::AnswerCorruption* corruption, double fraction,
                                         const model::CharTokenizer& tokenizer,
                                         int64_t* corrupted) {
  std::vector<SftExample> examples;
  examples.reserve(count);
  auto encode = [&](const tasks::Example& example, const std::string& answer, double weight) {
    return SftExample{tokenizer.Encode(example.prompt, /*add_bos=*/true),
                      tokenizer.Encode(answer, /*add_bos=*/false, /*add_eos=*/true), weight};
  };
  *corrupted = 0;
  for (size_t i = 0; i < count; ++i) {
    const tasks::Example& example = train.at(i);
    if (corruption == nullptr || !corruption->Covers(example)) {
      examples.push_back(encode(example, example.answer, 1.0));
      continue;
    }
    ++*corrupted;
    examples.push_back(encode(example, corruption->AnswerFor(example), fraction));
    if (fraction < 1.0) examples.push_back(encode(example, example.answer, 1.0 - fraction));
  }
  return examples;
}

// Greedy accuracy on `dataset` (all of it); unset when it is empty.
std::optional<double> AccuracyIfAny(model::Decoder& decoder, const PromptEncoder& prompts,
                                    const tasks::Dataset& dataset, int64_t max_new_tokens) {
  if (dataset.size() == 0) return std::nullopt;
  return DatasetAccuracy(decoder, prompts, dataset, dataset.size(), max_new_tokens);
}

// bootstrap.target_accuracy and check_every as they are used: the target in
// [0, 1], at least one step between checks, prompts to check on.
absl::Status ValidateTarget(const services::SftConfig& sft, const std::string& role_name,
                            size_t check_examples) {
  if (!(sft.target_accuracy >= 0.0 && sft.target_accuracy <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", role_name,
                     ".bootstrap.target_accuracy': ", sft.target_accuracy, " is not in [0, 1]"));
  }
  if (sft.target_accuracy == 0.0) return absl::OkStatus();
  if (sft.check_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key '", role_name, ".bootstrap.check_every': ", sft.check_every, " is not >= 1"));
  }
  if (check_examples == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", role_name,
                     ".bootstrap.target_accuracy' needs trainer.eval_examples > 0 (the "
                     "training prompts it is checked on)"));
  }
  return absl::OkStatus();
}

// SftOptions::stop_after for bootstrap.target_accuracy: every check_every
// steps, greedy accuracy on all of `check` (training examples); true (and
// result->reached_target) at the first check that reaches the target. Each
// check is logged. `decoder`, `check` and `log` must outlive it.
std::function<bool(int64_t)> StopAtTargetAccuracy(
    const services::SftConfig& sft, const std::string& role_name, model::Decoder& decoder,
    const PromptEncoder& prompts, const tasks::Dataset& check, int64_t max_new_tokens,
    std::ostream& log, SftResult* result) {
  return [=, &decoder, &check, &log](int64_t done) {
    if (done % sft.check_every != 0) return false;
    const double accuracy = DatasetAccuracy(decoder, prompts, check, check.size(), max_new_tokens);
    result->reached_target = accuracy >= sft.target_accuracy;
    log << absl::StrFormat(
               "[%s sft] step %d: accuracy on %d training prompts %.3f (target %.3f)%s\n",
               role_name, done, check.size(), accuracy, sft.target_accuracy,
               result->reached_target ? ": reached, stopping" : "")
        << std::flush;
    return result->reached_target;
  };
}

// What one SFT run trains and measures on: the task's splits, the examples
// drawn from (with a corruption rule's wrong answers, when one is set) and
// the training prompts the target and train_accuracy are checked on.
struct SftData {
  std::unique_ptr<tasks::Dataset> train, heldout;
  size_t train_count = 0;  // the first train examples trained on
  size_t eval_count = 0;   // the first held-out examples measured
  std::optional<tasks::AnswerCorruption> corruption;
  int64_t corrupted = 0;  // training examples the rule covers
  std::vector<SftExample> examples;
  std::optional<tasks::VectorDataset> check;
};

// kappa sft trains kappa's toy models from scratch: the character tokenizer
// and raw prompts, the same encoding the learner uses for them. INVALID_ARGUMENT
// naming the key for a bad corruption rule or target.
absl::StatusOr<SftData> PrepareSftData(const services::Config& config, Role role,
                                       const model::CharTokenizer& tokenizer, std::ostream& log) {
  const services::SftConfig& sft = RoleBootstrap(config, role);
  const std::string role_name = RoleName(role);
  SftData data;
  KAPPA_ASSIGN_OR_RETURN(data.train, tasks::MakeDataset(config, tasks::Split::kTrain));
  KAPPA_ASSIGN_OR_RETURN(data.heldout, tasks::MakeDataset(config, tasks::Split::kHeldOut));
  data.train_count = data.train->size();
  if (sft.train_examples > 0) {
    data.train_count = std::min(data.train_count, static_cast<size_t>(sft.train_examples));
  }
  KAPPA_ASSIGN_OR_RETURN(data.corruption, ParseCorruption(sft, role_name));
  data.examples =
      BuildSftExamples(*data.train, data.train_count, data.corruption ? &*data.corruption : nullptr,
                       sft.corrupt_fraction, tokenizer, &data.corrupted);
  if (data.corruption) {
    log << absl::StrFormat(
        "[%s sft] corrupt=%s: %d of %d training examples get its wrong answer (drawn so with "
        "chance %g)\n",
        role_name, data.corruption->name(), data.corrupted, data.train_count, sft.corrupt_fraction);
  }
  const auto eval_examples =
      static_cast<size_t>(std::max<int64_t>(config.trainer.eval_examples, 0));
  data.eval_count = std::min<size_t>(data.heldout->size(), eval_examples);
  // Spread over the examples trained on, so that they have their mix.
  data.check = tasks::EvenlySpacedSample(*data.train, data.train_count, eval_examples);
  KAPPA_RETURN_IF_ERROR(ValidateTarget(sft, role_name, data.check->size()));
  return data;
}

// The role's SFT recipe as SftTrain options; each step's count
// goes to result->steps and every tenth of the run to `log`.
SftOptions MakeSftOptions(const services::SftConfig& sft, const std::string& role_name,
                          const std::function<double()>& elapsed, std::ostream& log,
                          SftResult* result) {
  SftOptions options;
  options.steps = sft.steps;
  options.batch_size = sft.batch_size;
  options.lr = sft.lr;
  options.weight_decay = sft.weight_decay;
  options.warmup_steps = sft.warmup_steps;
  options.seed = sft.seed;
  const int64_t report_every = std::max<int64_t>(1, sft.steps / 10);
  const int64_t steps = sft.steps;
  options.on_step = [=, &log](int64_t step, double loss) {
    // `step` is 0-based; report the count of steps done.
    const int64_t done = step + 1;
    result->steps = done;
    if (done % report_every == 0 || done == steps) {
      log << absl::StrFormat("[%s sft] step %d/%d loss %.4f (%.1f s)\n", role_name, done, steps,
                             loss, elapsed())
          << std::flush;
    }
  };
  return options;
}

// With a corruption rule: accuracy on the held-out examples it covers (true
// answers, and the rule's answers) and on the rest, into `result` and `log`.
void MeasureCorruption(const SftData& data, const services::SftConfig& sft,
                       const std::string& role_name, model::Decoder& decoder,
                       const PromptEncoder& prompts, int64_t max_new_tokens, std::ostream& log,
                       SftResult* result) {
  const tasks::AnswerCorruption& rule = *data.corruption;
  result->corrupt = rule.name();
  result->corrupt_fraction = sft.corrupt_fraction;
  result->corrupted_train_examples = data.corrupted;
  const CorruptionSplit split = SplitByCorruption(*data.heldout, data.eval_count, rule);
  result->covered_accuracy = AccuracyIfAny(decoder, prompts, split.covered, max_new_tokens);
  result->covered_corrupt_agreement =
      AccuracyIfAny(decoder, prompts, split.covered_as_corrupted, max_new_tokens);
  result->rest_accuracy = AccuracyIfAny(decoder, prompts, split.rest, max_new_tokens);
  log << absl::StrFormat(
             "[%s sft] held-out: %d covered by %s, accuracy %.3f, answered as the rule "
             "answers %.3f; %d others, accuracy %.3f\n",
             role_name, split.covered.size(), rule.name(), result->covered_accuracy.value_or(0.0),
             result->covered_corrupt_agreement.value_or(0.0), split.rest.size(),
             result->rest_accuracy.value_or(0.0))
      << std::flush;
}

absl::StatusOr<SftResult> RunSftOrThrow(const services::Config& config, Role role,
                                        const std::string& out_dir, std::ostream& log) {
  const auto start = std::chrono::steady_clock::now();
  const std::function<double()> elapsed = [start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const services::SftConfig& sft = RoleBootstrap(config, role);
  const std::string role_name = RoleName(role);
  const int64_t max_new_tokens = config.rollout.max_new_tokens;
  model::CharTokenizer tokenizer;
  const PromptEncoder prompts = PromptEncoder::Character();
  KAPPA_ASSIGN_OR_RETURN(const SftData data, PrepareSftData(config, role, tokenizer, log));

  torch::manual_seed(sft.seed);
  model::Decoder decoder(DecoderConfig(RoleShape(config, role), role, tokenizer));
  SftResult result;
  result.checkpoint_dir = out_dir;
  result.train_examples = static_cast<int64_t>(data.train_count);
  result.eval_examples = static_cast<int64_t>(data.eval_count);
  if (data.eval_count > 0) {
    result.accuracy_before =
        DatasetAccuracy(decoder, prompts, *data.heldout, data.eval_count, max_new_tokens);
  }
  log << absl::StrFormat(
             "[%s sft] %d train examples, %d steps, batch %d, lr %g; held-out "
             "accuracy before: %.3f (%d examples)\n",
             role_name, data.train_count, sft.steps, sft.batch_size, sft.lr, result.accuracy_before,
             data.eval_count)
      << std::flush;

  SftOptions options = MakeSftOptions(sft, role_name, elapsed, log, &result);
  if (sft.target_accuracy > 0) {
    result.target_accuracy = sft.target_accuracy;
    options.stop_after = StopAtTargetAccuracy(sft, role_name, decoder, prompts, *data.check,
                                              max_new_tokens, log, &result);
  }
  result.loss = sft.steps > 0 ? SftTrain(decoder, data.examples, options) : 0.0;

  if (data.eval_count > 0) {
    result.accuracy =
        DatasetAccuracy(decoder, prompts, *data.heldout, data.eval_count, max_new_tokens);
    // The same measure on examples it trained on: a large gap means it
    // memorized rather than learned the task.
    result.train_accuracy =
        DatasetAccuracy(decoder, prompts, *data.check, data.check->size(), max_new_tokens);
  }
  if (data.corruption) {
    MeasureCorruption(data, sft, role_name, decoder, prompts, max_new_tokens, log, &result);
  }
  result.seconds = elapsed();
  std::filesystem::path parent = std::filesystem::path(out_dir).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  model::SaveCheckpoint(out_dir, decoder);
  WriteSummary(out_dir, role, result);
  log << absl::StrFormat(
             "[%s sft] held-out accuracy %.3f -> %.3f (train %.3f), final loss "
             "%.4f after %d steps, %.1f s; saved %s\n",
             role_name, result.accuracy_before, result.accuracy, result.train_accuracy, result.loss,
             result.steps, result.seconds, out_dir)
      << std::flush;
  return result;
}

}  // namespace

absl::StatusOr<Role> ParseRole(std::string_view name) {
  if (name == "teacher") return Role::kTeacher;
  if (name == "student") return Role::kStudent;
  return absl::InvalidArgumentError(
      absl::StrCat("role '", std::string(name), "' is not one of: teacher, student"));
}

const char* RoleName(Role role) { return role == Role::kTeacher ? "teacher" : "student"; }

const services::ModelShape& RoleShape(const services::Config& config, Role role) {
  return role == Role::kTeacher ? config.teacher.shape : config.student.shape;
}

const services::SftConfig& RoleBootstrap(const services::Config& config, Role role) {
  return role == Role::kTeacher ? config.teacher.bootstrap : config.student.bootstrap;
}

absl::StatusOr<SftResult> RunSft(const services::Config& config, Role role,
                                 const std::string& out_dir, std::ostream& log) {
  KAPPA_ASSIGN_OR_RETURN(absl::StatusOr<SftResult> result,
                         base::CaptureExceptions(absl::StrCat(RoleName(role), " sft"), [&] {
                           return RunSftOrThrow(config, role, out_dir, log);
                         }));
  return result;
}

absl::StatusOr<SftResult> ReadSftSummary(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/" + kSftSummaryFile;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no ", path));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  SftResult result;
  result.checkpoint_dir = checkpoint_dir;
  result.accuracy = json.value("accuracy", 0.0);
  result.accuracy_before = json.value("accuracy_before", 0.0);
  result.train_accuracy = json.value("train_accuracy", 0.0);
  result.loss = json.value("loss", 0.0);
  result.steps = json.value("steps", int64_t{0});
  result.seconds = json.value("seconds", 0.0);
  result.train_examples = json.value("train_examples", int64_t{0});
  result.eval_examples = json.value("eval_examples", int64_t{0});
  return result;
}

}  // namespace kappa::learner
