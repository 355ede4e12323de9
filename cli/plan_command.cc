#include "cli/plan_command.h"

#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/args.h"
#include "cli/bootstrap.h"
#include "cli/device_memory.h"
#include "kappa/v1/teacher.pb.h"
#include "learner/policy_snapshot_dtype.h"
#include "learner/prompt_encoder.h"
#include "learner/sft_warm_start.h"
#include "learner/student_lora.h"
#include "learner/work_config.h"
#include "model/checkpoint.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "services/torch_runtime.h"
#include "tasks/from_config.h"

namespace kappa::cli {
namespace {

constexpr const char* kUsage = "usage: kappa plan CONFIG [key=value ...] [--json]\n";

ModelDims DimsOf(const model::ModelConfig& m) {
  ModelDims d;
  d.vocab = m.vocab_size;
  d.hidden = m.hidden_size;
  d.intermediate = m.intermediate_size;
  d.layers = m.num_hidden_layers;
  d.heads = m.num_attention_heads;
  d.kv_heads = m.num_key_value_heads;
  d.head_dim = m.head_dim();
  d.max_positions = m.max_position_embeddings;
  d.tied = m.tie_word_embeddings;
  d.qkv_bias = m.qkv_bias();
  d.o_bias = m.o_proj_bias();
  d.mlp_bias = m.mlp_bias;
  d.qk_norm = m.qk_norm();
  return d;
}

// The bootstrap's decoder (learner/sft_warm_start.cc DecoderConfig): the role's
// shape over the character tokenizer's vocabulary, Llama layout.
ModelDims BootstrapDims(const services::ModelShape& shape) {
  ModelDims d;
  d.vocab = model::CharTokenizer().vocab_size();
  d.hidden = shape.hidden_size;
  d.intermediate = shape.intermediate_size;
  d.layers = shape.num_hidden_layers;
  d.heads = shape.num_attention_heads;
  d.kv_heads = shape.num_key_value_heads;
  d.head_dim = shape.hidden_size / std::max<int64_t>(shape.num_attention_heads, 1);
  d.max_positions = shape.max_position_embeddings;
  return d;
}

absl::StatusOr<ModelDims> RoleDims(const services::Config& config, learner::Role role) {
  const std::string& dir =
      role == learner::Role::kTeacher ? config.teacher.checkpoint : config.student.checkpoint;
  std::string read_from = dir;
  if (dir.empty()) {
    read_from = BootstrapDir(config, role);
    if (!model::CheckpointExists(read_from)) return BootstrapDims(learner::RoleShape(config, role));
  } else if (!model::CheckpointExists(dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat(learner::RoleName(role), ".checkpoint '", dir, "' holds no checkpoint"));
  }
  try {
    return DimsOf(model::ReadModelConfig(read_from));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(learner::RoleName(role), " model '", read_from, "': ", e.what()));
  }
}

struct PromptFacts {
  int64_t longest = 0;
  int64_t heldout = 0;
};

// The learner's prompts exactly as it encodes them (learner/main.cc): the
// student's tokenizer and chat template, or the character tokenizer of the
// bootstrap models.
absl::StatusOr<PromptFacts> Prompts(const services::Config& config) {
  absl::StatusOr<std::unique_ptr<tasks::Dataset>> train =
      tasks::MakeDataset(config, tasks::Split::kTrain);
  if (!train.ok()) return train.status();
  absl::StatusOr<std::unique_ptr<tasks::Dataset>> heldout =
      tasks::MakeDataset(config, tasks::Split::kHeldOut);
  if (!heldout.ok()) return heldout.status();
  PromptFacts facts;
  facts.heldout = static_cast<int64_t>((*heldout)->size());
  if (config.plan.prompt_tokens > 0) {
    facts.longest = config.plan.prompt_tokens;
    return facts;
  }
  absl::StatusOr<learner::PromptEncoder> encoder =
      config.student.checkpoint.empty()
          ? absl::StatusOr<learner::PromptEncoder>(learner::PromptEncoder::Character())
          : learner::PromptEncoder::ForRun(config, config.student.checkpoint,
                                           services::TeacherModelDir(config));
  if (!encoder.ok()) return encoder.status();
  for (const auto& [dataset, what] :
       {std::pair{train->get(), "train"}, std::pair{heldout->get(), "held-out"}}) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> ids = encoder->EncodeAll(*dataset, what);
    if (!ids.ok()) return ids.status();
    for (const auto& prompt : *ids) {
      facts.longest = std::max(facts.longest, static_cast<int64_t>(prompt.size()));
    }
  }
  return facts;
}

torch::Device DeviceNamed(const std::string& name) {
  return absl::StartsWith(name, "cuda") ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
}

int64_t DtypeBytes(services::ModelDtype dtype, const std::string& device) {
  return services::ResolveModelDtype(dtype, DeviceNamed(device)) == torch::kBFloat16 ? 2 : 4;
}

TeacherRows RowsFor(const services::Config& config) {
  switch (learner::TeacherFormFor(config)) {
    case kappa::v1::SCORE_FORM_FULL:
      return TeacherRows::kFull;
    case kappa::v1::SCORE_FORM_TOPK:
      return TeacherRows::kTopK;
    case kappa::v1::SCORE_FORM_SAMPLED:
      return TeacherRows::kSampled;
    case kappa::v1::SCORE_FORM_HIDDEN:
      return TeacherRows::kHidden;
    default:
      return TeacherRows::kNone;
  }
}

int DeviceIndex(const std::string& device) {
  int index = 0;
  const size_t colon = device.find(':');
  if (colon != std::string::npos && !absl::SimpleAtoi(device.substr(colon + 1), &index)) index = 0;
  return index;
}

std::string Percent(int64_t part, int64_t whole) {
  return whole > 0 ? absl::StrFormat("%.0f %%", 100.0 * part / whole) : "-";
}

void PrintDims(std::ostream& out, const char* role, const ModelDims& d) {
  out << absl::StrFormat("  %s: %.1f M parameters (V %d, d %d, f %d, %d layers, %d/%d heads%s)\n",
                         role, d.Parameters() / 1e6, d.vocab, d.hidden, d.intermediate, d.layers,
                         d.heads, d.kv_heads, d.tied ? ", tied" : "");
}

// With student.lora: the adapters the learner trains instead of the student.
void PrintAdapters(std::ostream& out, const PlanInputs& in) {
  const services::Config::Student::Lora& lora = in.config.student.lora;
  if (lora.rank <= 0) return;
  out << absl::StrFormat("  student.lora: rank %d on %s: N_a %.2f M adapter parameters trained\n",
                         lora.rank, absl::StrJoin(lora.target_modules, " "),
                         in.student.AdapterParameters(lora) / 1e6);
}

void PrintText(std::ostream& out, const PlanInputs& in, const MemoryPlan& plan,
               const std::map<std::string, int64_t>& capacity, const absl::Status& fits) {
  PrintDims(out, "student", in.student);
  PrintAdapters(out, in);
  PrintDims(out, "teacher", in.teacher);
  out << absl::StrFormat("  sequences: longest prompt P %d + max_new_tokens T %d tokens\n",
                         in.prompt_tokens, in.config.rollout.max_new_tokens);
  for (const ProcessPlan& process : plan.processes) {
    out << absl::StrFormat("\n%-44s %10s  on %s\n", process.name, FormatBytes(process.Bytes()),
                           process.device);
    for (const PlanTerm& term : process.terms) {
      out << absl::StrFormat("  %-40s %12s  %-7s %s%s\n", term.name, FormatBytes(term.bytes),
                             term.device, term.formula,
                             term.key.empty() ? "" : absl::StrCat("  [", term.key, "]"));
    }
  }
  out << "\ndevices (a device fits at <= " << kPlanFitShare << " x its capacity):\n";
  for (const std::string& device : plan.Devices()) {
    const int64_t total = plan.DeviceBytes(device);
    const auto it = capacity.find(device);
    if (it == capacity.end() || it->second <= 0) {
      out << absl::StrFormat("  %-7s %12s  capacity unknown: not checked\n", device,
                             FormatBytes(total));
      continue;
    }
    const bool ok = total <= kPlanFitShare * static_cast<double>(it->second);
    out << absl::StrFormat("  %-7s %12s  of %s (%s): %s\n", device, FormatBytes(total),
                           FormatBytes(it->second), Percent(total, it->second),
                           ok ? "fits" : "DOES NOT FIT");
  }
  out << "\nweight sync per policy version: " << FormatBytes(plan.sync_bytes_per_version) << " ("
      << plan.sync_formula << ")\n";
  out << "messages (security.max_message_bytes "
      << FormatBytes(in.config.security.max_message_bytes) << "):\n";
  for (const MessagePlan& message : plan.messages) {
    out << absl::StrFormat("  %-14s %12s  %s: %s\n", message.name, FormatBytes(message.bytes),
                           message.formula, message.bytes <= message.limit ? "fits" : "TOO LARGE");
  }
  out << "\n"
      << (fits.ok() ? "plan: fits" : absl::StrCat("plan: does not fit: ", fits.message())) << "\n";
}

nlohmann::json DimsJson(const ModelDims& d) {
  return {{"parameters", d.Parameters()},   {"vocab", d.vocab},       {"hidden", d.hidden},
          {"intermediate", d.intermediate}, {"layers", d.layers},     {"heads", d.heads},
          {"kv_heads", d.kv_heads},         {"head_dim", d.head_dim}, {"tied", d.tied}};
}

// DimsJson, and the adapters student.lora trains (0: every weight).
nlohmann::json StudentJson(const PlanInputs& in) {
  nlohmann::json student = DimsJson(in.student);
  student["adapter_parameters"] = in.student.AdapterParameters(in.config.student.lora);
  return student;
}

nlohmann::json PlanJson(const PlanInputs& in, const MemoryPlan& plan,
                        const std::map<std::string, int64_t>& capacity, const absl::Status& fits) {
  nlohmann::json processes = nlohmann::json::array();
  for (const ProcessPlan& process : plan.processes) {
    nlohmann::json terms = nlohmann::json::array();
    for (const PlanTerm& term : process.terms) {
      terms.push_back({{"name", term.name},
                       {"device", term.device},
                       {"bytes", term.bytes},
                       {"key", term.key},
                       {"formula", term.formula}});
    }
    nlohmann::json by_device = nlohmann::json::object();
    for (const PlanTerm& term : process.terms) by_device[term.device] = process.Bytes(term.device);
    processes.push_back({{"name", process.name},
                         {"device", process.device},
                         {"bytes", process.Bytes()},
                         {"bytes_by_device", by_device},
                         {"terms", terms}});
  }
  nlohmann::json devices = nlohmann::json::array();
  for (const std::string& device : plan.Devices()) {
    const auto it = capacity.find(device);
    const int64_t cap = it == capacity.end() ? 0 : it->second;
    const int64_t total = plan.DeviceBytes(device);
    devices.push_back({{"device", device},
                       {"bytes", total},
                       {"capacity", cap},
                       {"fits", cap <= 0 || total <= kPlanFitShare * static_cast<double>(cap)}});
  }
  nlohmann::json messages = nlohmann::json::array();
  for (const MessagePlan& message : plan.messages) {
    messages.push_back({{"name", message.name},
                        {"bytes", message.bytes},
                        {"limit", message.limit},
                        {"formula", message.formula}});
  }
  return {{"fits", fits.ok()},
          {"reason", fits.ok() ? "" : std::string(fits.message())},
          {"student", StudentJson(in)},
          {"teacher", DimsJson(in.teacher)},
          {"prompt_tokens", in.prompt_tokens},
          {"max_new_tokens", in.config.rollout.max_new_tokens},
          {"processes", processes},
          {"devices", devices},
          {"sync_bytes_per_version", plan.sync_bytes_per_version},
          {"sync_formula", plan.sync_formula},
          {"messages", messages}};
}

}  // namespace

absl::StatusOr<PlanInputs> PlanInputsFor(const services::Config& config) {
  PlanInputs in;
  in.config = config;
  // The learner's own check of student.lora (unknown targets, rank < 0).
  absl::StatusOr<std::optional<model::LoraConfig>> lora = learner::StudentLoraConfig(config);
  if (!lora.ok()) return lora.status();
  absl::StatusOr<ModelDims> teacher = RoleDims(config, learner::Role::kTeacher);
  if (!teacher.ok()) return teacher.status();
  absl::StatusOr<ModelDims> student = RoleDims(config, learner::Role::kStudent);
  if (!student.ok()) return student.status();
  in.teacher = *teacher;
  in.student = *student;
  absl::StatusOr<PromptFacts> prompts = Prompts(config);
  if (!prompts.ok()) return prompts.status();
  in.prompt_tokens = prompts->longest;
  in.heldout_examples = prompts->heldout;
  in.teacher_rows = RowsFor(config);

  in.worker_weight_bytes = DtypeBytes(config.student.dtype, config.rollout.device);
  in.teacher_weight_bytes = DtypeBytes(config.teacher.dtype, config.teacher.device);
  // The wire: rollout.weights_dtype, auto being the worker's model dtype
  // (rollout_worker/policy_watcher.h WireDtype). The snapshot: the
  // learner's own rule (PolicySnapshotDtype).
  using services::ModelDtype;
  const ModelDtype wire = config.rollout.weights_dtype;
  in.wire_bytes = wire == ModelDtype::kBFloat16  ? 2
                  : wire == ModelDtype::kFloat32 ? 4
                                                 : in.worker_weight_bytes;
  in.snapshot_bytes = learner::PolicySnapshotDtype(config) == torch::kBFloat16 ? 2 : 4;
  return in;
}

std::map<std::string, int64_t> DetectCapacity(const services::Config& config,
                                              const MemoryPlan& plan) {
  std::map<std::string, int64_t> capacity;
  for (const std::string& device : plan.Devices()) {
    if (device == "host") {
      if (config.plan.host_memory_bytes > 0) {
        capacity[device] = config.plan.host_memory_bytes;
      } else if (std::optional<int64_t> host = AvailableHostMemory()) {
        capacity[device] = *host;
      }
    } else if (config.plan.device_memory_bytes > 0) {
      capacity[device] = config.plan.device_memory_bytes;
    } else if (std::optional<int64_t> free = FreeDeviceMemory(DeviceIndex(device))) {
      capacity[device] = *free;
    }
  }
  return capacity;
}

absl::Status CheckRunPlan(const services::Config& config) {
  absl::StatusOr<PlanInputs> inputs = PlanInputsFor(config);
  if (!inputs.ok()) return absl::OkStatus();
  const MemoryPlan plan = PlanMemory(*inputs);
  return CheckPlanFits(plan, config, DetectCapacity(config, plan));
}

int PlanCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<CommandLine> line = ParseCommandLine(args, {}, {"--json"});
  if (!line.ok()) {
    err << "kappa plan: " << line.status().message() << "\n" << kUsage;
    return 2;
  }
  absl::StatusOr<std::vector<std::string>> overrides =
      services::WithEnvironmentOverrides(line->overrides, environ);
  if (!overrides.ok()) {
    err << "kappa plan: " << overrides.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<services::Config> config = services::LoadConfig(line->config_path, *overrides);
  if (!config.ok()) {
    err << "kappa plan: " << config.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<PlanInputs> inputs = PlanInputsFor(*config);
  if (!inputs.ok()) {
    err << "kappa plan: " << inputs.status().message() << "\n";
    return 1;
  }
  const MemoryPlan plan = PlanMemory(*inputs);
  const std::map<std::string, int64_t> capacity = DetectCapacity(*config, plan);
  const absl::Status fits = CheckPlanFits(plan, *config, capacity);
  if (line->Has("--json")) {
    out << PlanJson(*inputs, plan, capacity, fits).dump(2) << "\n";
  } else {
    out << "kappa plan: " << line->config_path << "\n";
    PrintText(out, *inputs, plan, capacity, fits);
  }
  return fits.ok() ? 0 : 1;
}

}  // namespace kappa::cli
