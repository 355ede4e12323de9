// PEFT adapter directories: adapter_config.json as peft/tuners/lora/config.py
// writes it, adapter_model.safetensors as peft/utils/save_and_load.py names
// its tensors, and the merge W + scaling · B · A of
// peft/tuners/lora/layer.py (Linear.get_delta_weight, fan_in_fan_out off).
#include "model/peft_adapter.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <vector>

#include "model/file_io.h"
#include "model/name_text.h"
#include "model/safetensors.h"

namespace kappa::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// What PEFT puts before a base model's parameter name in the saved state dict.
constexpr char kPeftPrefix[] = "base_model.model.";

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The refusal of one field of adapter_config.json.
[[noreturn]] void FailField(const std::string& file, const std::string& field,
                            const std::string& why) {
  throw std::runtime_error(file + ": \"" + field + "\" " + why);
}

// ---------------------------------------------------------------- adapter_config.json

// A field that is absent or null.
bool Absent(const Json& j, const std::string& field) {
  auto it = j.find(field);
  return it == j.end() || it->is_null();
}

// A field that is absent, null, or an empty list, object or string: PEFT
// treats these alike ("not used").
bool AbsentOrEmpty(const Json& j, const std::string& field) {
  if (Absent(j, field)) return true;
  const Json& v = j.at(field);
  return (v.is_array() || v.is_object() || v.is_string()) && v.empty();
}

bool BoolField(const Json& j, const std::string& field, bool fallback, const std::string& file) {
  if (Absent(j, field)) return fallback;
  if (!j.at(field).is_boolean())
    FailField(file, field, "must be true or false, got " + j.at(field).dump());
  return j.at(field).get<bool>();
}

double NumberField(const Json& j, const std::string& field, double fallback,
                   const std::string& file) {
  if (Absent(j, field)) return fallback;
  if (!j.at(field).is_number())
    FailField(file, field, "must be a number, got " + j.at(field).dump());
  return j.at(field).get<double>();
}

// Fields whose value must stay PEFT's default, because kappa does not
// implement what another value does. `why` names the feature.
struct UnimplementedField {
  const char* field;
  const char* why;
};

// Must be false when present.
constexpr UnimplementedField kFalseFields[] = {
    {"use_dora", "DoRA (weight-decomposed LoRA) is not supported"},
    {"lora_bias", "a bias on lora_B is not supported"},
    {"fan_in_fan_out", "transposed (Conv1D-style) base weights are not supported"},
    {"use_qalora", "QALoRA is not supported"},
};

// Must be absent, null or empty.
constexpr UnimplementedField kEmptyFields[] = {
    {"modules_to_save", "fully trained extra modules are not supported"},
    {"layers_to_transform", "adapters on some layers only are not supported"},
    {"layers_pattern", "adapters on some layers only are not supported"},
    {"rank_pattern", "per-module ranks are not supported"},
    {"alpha_pattern", "per-module alphas are not supported"},
    {"exclude_modules", "excluding modules from the targets is not supported"},
    {"target_parameters", "adapters on bare parameters are not supported"},
    {"trainable_token_indices", "trainable token embeddings are not supported"},
    {"layer_replication", "layer replication is not supported"},
    {"alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"},
    {"use_bdlora", "block-diagonal LoRA is not supported"},
    {"velora_config", "VeLoRA is not supported"},
    {"monteclora_config", "MonteCLoRA is not supported"},
    {"arrow_config", "Arrow routing is not supported"},
};

void RefuseUnimplemented(const Json& j, const std::string& file) {
  for (const UnimplementedField& f : kFalseFields) {
    if (BoolField(j, f.field, false, file))
      FailField(file, f.field, std::string("is true: ") + f.why);
  }
  for (const UnimplementedField& f : kEmptyFields) {
    if (!AbsentOrEmpty(j, f.field)) {
      FailField(file, f.field,
                "is " + j.at(f.field).dump() + ": " + f.why + " (must be null or empty)");
    }
  }
  if (!Absent(j, "bias") && j.at("bias") != "none") {
    FailField(file, "bias",
              "is " + j.at("bias").dump() + ": only \"none\" is supported (no bias is trained)");
  }
}

void CheckPeftAndTaskType(const Json& j, const std::string& file) {
  if (Absent(j, "peft_type"))
    FailField(file, "peft_type", "is missing (a LoRA adapter has \"LORA\")");
  if (j.at("peft_type") != "LORA") {
    FailField(file, "peft_type",
              "is " + j.at("peft_type").dump() + ": only \"LORA\" adapters are supported");
  }
  if (!Absent(j, "task_type") && j.at("task_type") != "CAUSAL_LM") {
    FailField(file, "task_type",
              "is " + j.at("task_type").dump() + ": only \"CAUSAL_LM\" adapters are supported");
  }
}

// PEFT's initializations that leave the base weights as they are; the
// others (olora, pissa*, corda, loftq) change the base, so an adapter saved
// with them belongs to a base kappa does not have.
void CheckInitLeavesTheBase(const Json& j, const std::string& file) {
  if (Absent(j, "init_lora_weights") || j.at("init_lora_weights").is_boolean()) return;
  const Json& init = j.at("init_lora_weights");
  for (const char* kept : {"gaussian", "eva", "orthogonal", "mica"}) {
    if (init == kept) return;
  }
  FailField(file, "init_lora_weights",
            "is " + init.dump() +
                ": that initialization changes the base weights, so the adapter does not apply to "
                "the unchanged base (convert it in PEFT first)");
}

std::string TargetRefusal(const std::string& name) {
  if (name == "lm_head" || name == "embed_tokens") {
    return "adapters on " + name + " are not supported";
  }
  return "is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
}

// target_modules: a list of projection names. PEFT's default for Llama,
// Qwen2 and Qwen3 (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) when
// absent; a string (a regular expression, or "all-linear") is refused.
std::vector<std::string> ParseTargetModules(const Json& j, const std::string& file) {
  if (Absent(j, "target_modules")) return {"q_proj", "v_proj"};
  const Json& targets = j.at("target_modules");
  if (targets.is_string()) {
    FailField(file, "target_modules",
              "is the string " + targets.dump() +
                  ": a regular expression (or \"all-linear\") is not implemented; list the module "
                  "names");
  }
  if (!targets.is_array() || targets.empty()) {
    FailField(file, "target_modules",
              "must be a non-empty list of module names, got " + targets.dump());
  }
  const std::vector<std::string>& known = LoraTargetNames();
  std::vector<std::string> names;
  for (const Json& entry : targets) {
    if (!entry.is_string())
      FailField(file, "target_modules", "holds " + entry.dump() + ", not a name");
    const std::string name = entry.get<std::string>();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      FailField(file, "target_modules", "'" + name + "' " + TargetRefusal(name));
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      FailField(file, "target_modules", "lists '" + name + "' twice");
    }
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

LoraConfig ParseLoraNumbers(const Json& j, const std::string& file) {
  LoraConfig lora;
  // peft/tuners/lora/config.py's defaults: r 8, lora_alpha 8, lora_dropout 0.
  lora.rank = 8;
  if (!Absent(j, "r")) {
    if (!j.at("r").is_number_integer() || j.at("r").get<int64_t>() < 1) {
      FailField(file, "r", "must be an integer >= 1, got " + j.at("r").dump());
    }
    lora.rank = j.at("r").get<int64_t>();
  }
  lora.alpha = NumberField(j, "lora_alpha", 8.0, file);
  if (!(lora.alpha > 0))
    FailField(file, "lora_alpha", "must be > 0, got " + j.at("lora_alpha").dump());
  lora.dropout = NumberField(j, "lora_dropout", 0.0, file);
  if (!(lora.dropout >= 0 && lora.dropout < 1)) {
    FailField(file, "lora_dropout", "must be in [0, 1), got " + j.at("lora_dropout").dump());
  }
  lora.use_rslora = BoolField(j, "use_rslora", false, file);
  return lora;
}

// lora_alpha as PEFT writes it: an integer when it is one.
Json AlphaJson(double alpha) {
  if (alpha == std::floor(alpha) && std::abs(alpha) < 1e15) return static_cast<int64_t>(alpha);
  return alpha;
}

// ---------------------------------------------------------------- adapter_model.safetensors

// kappa's name of a tensor of adapter_model.safetensors: PEFT's saved key
// ("base_model.model.<HF module>.lora_A.weight") or, as vLLM also accepts,
// the same without the prefix. Throws naming the tensor for anything else.
std::string KappaAdapterName(const std::string& key, const std::string& file) {
  const std::string where = file + ": tensor \"" + key + "\" ";
  if (Contains(key, ".lora_embedding_"))
    throw std::runtime_error(where + "is an adapter on an embedding: not supported");
  if (Contains(key, ".lora_magnitude_vector")) {
    throw std::runtime_error(where + "is DoRA's magnitude vector: DoRA is not supported");
  }
  const std::string name = StartsWith(key, kPeftPrefix) ? key.substr(sizeof(kPeftPrefix) - 1) : key;
  if (EndsWith(name, ".lora_A.weight") || EndsWith(name, ".lora_B.weight")) return name;
  if (EndsWith(name, ".lora_B.bias"))
    throw std::runtime_error(where + "is a bias on lora_B (lora_bias): not supported");
  throw std::runtime_error(
      where +
      "is not a LoRA weight (base_model.model.<module>.lora_A.weight or "
      ".lora_B.weight): base weights and other PEFT tensors are not supported");
}

// The shape an adapter tensor must have on the base, and why.
struct ExpectedTensor {
  std::vector<int64_t> shape;
  std::string base_weight;  // the projection's weight name
  std::vector<int64_t> base_shape;
};

// Every adapter tensor `lora` puts on `model`'s base: lora_A [r, in] and
// lora_B [out, r] of each targeted projection of each layer.
std::map<std::string, ExpectedTensor> ExpectedAdapterTensors(Decoder& model,
                                                             const LoraConfig& lora) {
  std::map<std::string, ExpectedTensor> expected;
  for (const auto& [name, weight] : NamedWeights(model)) {
    if (!EndsWith(name, ".weight")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    const std::string projection = module.substr(module.rfind('.') + 1);
    const auto& targets = lora.target_modules;
    if (std::find(targets.begin(), targets.end(), projection) == targets.end()) continue;
    const int64_t out = weight.size(0), in = weight.size(1);
    expected[module + ".lora_A.weight"] = {{lora.rank, in}, name, weight.sizes().vec()};
    expected[module + ".lora_B.weight"] = {{out, lora.rank}, name, weight.sizes().vec()};
  }
  return expected;
}

// An unexpected adapter tensor, with the reason when kappa knows it.
std::string UnexpectedNote(const std::string& key, const std::string& kappa_name) {
  for (const char* module : {"lm_head", "embed_tokens"}) {
    if (Contains(kappa_name, std::string(module) + ".lora_")) {
      return key + " (adapters on " + module + " are not supported)";
    }
  }
  return key + " (not a projection adapter_config.json targets)";
}

// The adapter file's tensors by kappa name, checked against what the
// config puts on the model: none missing or unexpected, every shape fitting
// the base, F32/BF16/F16. Views into `file`.
std::map<std::string, torch::Tensor> CheckedAdapterTensors(Decoder& model, const LoraConfig& lora,
                                                           const SafetensorsFile& file) {
  const std::string& path = file.path();
  const std::map<std::string, ExpectedTensor> expected = ExpectedAdapterTensors(model, lora);
  std::map<std::string, std::string> key_of;  // kappa name -> the file's key
  std::vector<std::string> unexpected, mismatched;
  for (const auto& [key, entry] : file.entries()) {
    const std::string name = KappaAdapterName(key, path);
    if (!key_of.emplace(name, key).second) {
      throw std::runtime_error(path + ": tensors \"" + key_of[name] + "\" and \"" + key +
                               "\" are the same adapter tensor");
    }
    if (entry.dtype != torch::kFloat32 && entry.dtype != torch::kBFloat16 &&
        entry.dtype != torch::kFloat16) {
      throw std::runtime_error(path + ": tensor \"" + key + "\" has dtype " +
                               c10::toString(entry.dtype) + " (an adapter is F32, BF16 or F16)");
    }
    auto it = expected.find(name);
    if (it == expected.end()) {
      unexpected.push_back(UnexpectedNote(key, name));
    } else if (entry.shape != it->second.shape) {
      mismatched.push_back(key + " (expected " + internal::ShapeText(it->second.shape) + " for r " +
                           std::to_string(lora.rank) + " on the base's " + it->second.base_weight +
                           " " + internal::ShapeText(it->second.base_shape) + ", got " +
                           internal::ShapeText(entry.shape) + ")");
    }
  }
  std::vector<std::string> missing;
  for (const auto& entry : expected) {
    if (key_of.count(entry.first) == 0) missing.push_back(kPeftPrefix + entry.first);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string msg = path + ":";
    if (!missing.empty()) msg += " missing [" + internal::JoinNames(missing) + "];";
    if (!unexpected.empty()) msg += " unexpected [" + internal::JoinNames(unexpected) + "];";
    if (!mismatched.empty()) msg += " shape mismatch [" + internal::JoinNames(mismatched) + "];";
    msg.pop_back();
    throw std::runtime_error(msg);
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [name, key] : key_of) tensors.emplace(name, file.View(key));
  return tensors;
}

// The model's adapters were enabled with a config that computes what
// `loaded` (from `file`) does: rank, alpha, rsLoRA and targets agree.
void CheckConfigsAgree(const LoraConfig& model_lora, const LoraConfig& loaded,
                       const std::string& file) {
  if (const std::optional<AdapterConfigDifference> d = FirstDifference(model_lora, loaded)) {
    FailField(file, d->field, "is " + d->theirs + " but the model's adapters have " + d->ours);
  }
}

torch::ScalarType DtypeNamed(const std::string& torch_dtype) {
  if (torch_dtype == "bfloat16") return torch::kBFloat16;
  if (torch_dtype == "float16") return torch::kFloat16;
  return torch::kFloat32;
}

}  // namespace

std::string AdapterConfigJson(const LoraConfig& config,
                              const std::string& base_model_name_or_path) {
  std::vector<std::string> targets = config.target_modules;
  std::sort(targets.begin(), targets.end());
  Json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", config.rank},
      {"lora_alpha", AlphaJson(config.alpha)},
      {"lora_dropout", config.dropout},
      {"target_modules", targets},
      {"use_rslora", config.use_rslora},
      {"bias", "none"},
      {"lora_bias", false},
      {"use_dora", false},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", Json::object()},
      {"alpha_pattern", Json::object()},
      {"inference_mode", true},
      {"base_model_name_or_path", base_model_name_or_path},
      {"revision", nullptr},
  };
  return j.dump(2) + "\n";  // keys sorted, as PEFT's json.dumps(sort_keys=True)
}

AdapterConfig ParseAdapterConfig(const std::string& json_text, const std::string& file) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw std::runtime_error(file + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(file + ": not a JSON object");
  CheckPeftAndTaskType(j, file);
  RefuseUnimplemented(j, file);
  CheckInitLeavesTheBase(j, file);
  AdapterConfig config;
  config.lora = ParseLoraNumbers(j, file);
  config.lora.target_modules = ParseTargetModules(j, file);
  try {
    config.lora.Validate();  // a backstop: every field was checked above
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(file + ": " + e.what());
  }
  if (!Absent(j, "base_model_name_or_path")) {
    if (!j.at("base_model_name_or_path").is_string()) {
      FailField(file, "base_model_name_or_path", "must be a string");
    }
    config.base_model_name_or_path = j.at("base_model_name_or_path").get<std::string>();
  }
  return config;
}

bool AdapterExists(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kAdapterConfigFile, ec);
}

void SaveAdapter(const std::string& dir, Decoder& model, const LoraConfig& config,
                 const std::string& base_model_name_or_path) {
  if (!model->has_lora()) throw std::logic_error("SaveAdapter: the model has no LoRA adapters");
  CheckConfigsAgree(model->lora_config(), config, "SaveAdapter's config");
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [name, tensor] : NamedAdapters(model)) {
    tensors.emplace(kPeftPrefix + name, tensor.detach().to(torch::kFloat32));
  }
  const std::string config_json = AdapterConfigJson(config, base_model_name_or_path);
  internal::WriteDirectoryAtomically(dir, [&](const std::string& tmp) {
    WriteSafetensors((fs::path(tmp) / kAdapterWeightsFile).string(), tensors);
    internal::WriteFileDurably((fs::path(tmp) / kAdapterConfigFile).string(), config_json);
  });
}

std::optional<AdapterConfigDifference> FirstDifference(const LoraConfig& ours,
                                                       const LoraConfig& theirs) {
  if (ours.rank != theirs.rank) {
    return AdapterConfigDifference{"r", std::to_string(ours.rank), std::to_string(theirs.rank)};
  }
  if (ours.alpha != theirs.alpha) {
    return AdapterConfigDifference{"lora_alpha", AlphaJson(ours.alpha).dump(),
                                   AlphaJson(theirs.alpha).dump()};
  }
  const auto boolean = [](bool b) { return std::string(b ? "true" : "false"); };
  if (ours.use_rslora != theirs.use_rslora) {
    return AdapterConfigDifference{"use_rslora", boolean(ours.use_rslora),
                                   boolean(theirs.use_rslora)};
  }
  std::vector<std::string> our_targets = ours.target_modules;
  std::vector<std::string> their_targets = theirs.target_modules;
  std::sort(our_targets.begin(), our_targets.end());
  std::sort(their_targets.begin(), their_targets.end());
  if (our_targets != their_targets) {
    return AdapterConfigDifference{"target_modules", Json(our_targets).dump(),
                                   Json(their_targets).dump()};
  }
  return std::nullopt;
}

AdapterConfig ReadAdapterConfig(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / kAdapterConfigFile).string();
  return ParseAdapterConfig(internal::ReadFile(config_path), config_path);
}

AdapterConfig LoadAdapter(const std::string& dir, Decoder& model) {
  const std::string config_path = (fs::path(dir) / kAdapterConfigFile).string();
  const AdapterConfig config = ReadAdapterConfig(dir);
  if (model->has_lora()) CheckConfigsAgree(model->lora_config(), config.lora, config_path);
  const fs::path weights_path = fs::path(dir) / kAdapterWeightsFile;
  std::error_code ec;
  if (!fs::is_regular_file(weights_path, ec)) {
    const bool pickle = fs::is_regular_file(fs::path(dir) / "adapter_model.bin", ec);
    throw std::runtime_error("no " + weights_path.string() +
                             (pickle ? " (adapter_model.bin, a pickle, is not read: save with "
                                       "safe_serialization=True)"
                                     : ""));
  }
  const std::unique_ptr<SafetensorsFile> file = SafetensorsFile::Open(weights_path.string());
  const std::map<std::string, torch::Tensor> tensors =
      CheckedAdapterTensors(model, config.lora, *file);
  if (!model->has_lora()) model->EnableLora(config.lora);
  LoadAdapters(model, tensors);
  return config;
}

Decoder LoadModelOrAdapter(const std::string& dir, const LoadOptions& options,
                           const std::string& base_dir) {
  if (!AdapterExists(dir)) return LoadCheckpoint(dir, options);
  const std::string config_path = (fs::path(dir) / kAdapterConfigFile).string();
  std::string base = base_dir;
  if (base.empty()) {
    base = ReadAdapterConfig(dir).base_model_name_or_path;
    if (!CheckpointExists(base)) {
      FailField(
          config_path, "base_model_name_or_path",
          "is \"" + base + "\", not a local model directory (give the base directory explicitly)");
    }
  }
  Decoder model = LoadCheckpoint(base, options);
  LoadAdapter(dir, model);
  return model;
}

std::map<std::string, torch::Tensor> MergedWeights(Decoder& model) {
  std::map<std::string, torch::Tensor> weights = NamedWeights(model);
  if (!model->has_lora()) return weights;
  const double scaling = model->lora_config().Scaling();
  const std::map<std::string, torch::Tensor> adapters = NamedAdapters(model);
  torch::NoGradGuard no_grad;
  const std::string a_suffix = ".lora_A.weight";
  for (const auto& [name, a] : adapters) {
    if (!EndsWith(name, a_suffix)) continue;
    const std::string module = name.substr(0, name.size() - a_suffix.size());
    const torch::Tensor& b = adapters.at(module + ".lora_B.weight");
    torch::Tensor& w = weights.at(module + ".weight");
    const torch::Tensor delta =
        torch::matmul(b.to(torch::kFloat32), a.to(torch::kFloat32)) * scaling;
    w = (w.to(torch::kFloat32) + delta.to(w.device())).to(w.scalar_type());
  }
  return weights;
}

std::string ExportMergedAdapter(const std::string& adapter_dir, const std::string& out_dir,
                                const std::string& base_dir) {
  if (!AdapterExists(adapter_dir)) {
    throw std::runtime_error("no " + (fs::path(adapter_dir) / kAdapterConfigFile).string() +
                             ": not a PEFT adapter directory");
  }
  Decoder adapted = LoadModelOrAdapter(adapter_dir, {}, base_dir);
  const ModelConfig& base_config = adapted->config();
  Decoder plain(base_config, /*random_init=*/false);
  LoadWeights(plain, MergedWeights(adapted));
  SaveOptions options;
  options.dtype = DtypeNamed(base_config.torch_dtype);
  SaveCheckpoint(out_dir, plain, options);
  return base_config.source_dir;
}

}  // namespace kappa::model
