#include "model/checkpoint.h"

#include <torch/torch.h>

#include <filesystem>
#include <stdexcept>
#include <vector>

#include "model/file_io.h"
#include "model/name_text.h"

namespace kappa::model {
namespace {

namespace fs = std::filesystem;

constexpr char kConfigFile[] = "config.json";

// Names HF checkpoints may carry that hold no parameter of ours.
bool IsIgnorable(const std::string& name, bool tied) {
  if (tied && name == "lm_head.weight") return true;  // the embedding again
  const std::string inv_freq = "rotary_emb.inv_freq";  // older HF versions saved it
  return name.size() >= inv_freq.size() &&
         name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
}

// Every tensor of `params` present with its shape and nothing unexpected
// (`ignorable` names aside), or a runtime_error listing each problem.
// `shape_of(name)` is null when absent.
template <typename ShapeOf, typename Names, typename Ignorable>
void CheckNames(const std::map<std::string, torch::Tensor>& params, const ShapeOf& shape_of,
                const Names& names, const Ignorable& ignorable, const std::string& where) {
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, param] : params) {
    const std::optional<std::vector<int64_t>> shape = shape_of(name);
    if (!shape) {
      missing.push_back(name);
    } else if (at::IntArrayRef(*shape) != param.sizes()) {
      mismatched.push_back(name + " (expected " + internal::ShapeText(param.sizes()) + ", got " +
                           internal::ShapeText(*shape) + ")");
    }
  }
  for (const auto& name : names) {
    if (params.count(name) == 0 && !ignorable(name)) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;
  std::string msg = where + ":";
  if (!missing.empty()) msg += " missing [" + internal::JoinNames(missing) + "];";
  if (!unexpected.empty()) msg += " unexpected [" + internal::JoinNames(unexpected) + "];";
  if (!mismatched.empty()) msg += " shape mismatch [" + internal::JoinNames(mismatched) + "];";
  msg.pop_back();
  throw std::runtime_error(msg);
}

// The model's weights against a checkpoint's names and shapes. Adapters are
// no weights: the model's are not missing, and one in the checkpoint is
// unexpected.
template <typename ShapeOf, typename Names>
void CheckWeightNames(Decoder& model, const ShapeOf& shape_of, const Names& names,
                      const std::string& where) {
  const bool tied = model->config().tie_word_embeddings;
  CheckNames(
      NamedWeights(model), shape_of, names,
      [&](const std::string& name) { return IsIgnorable(name, tied); }, where);
}

// Copies each checkpoint tensor into its parameter, dropping the mapped pages
// behind it so resident memory holds the parameters plus about one tensor.
void CopyCheckpointWeights(Decoder& model, const CheckpointWeights& weights) {
  std::vector<std::string> names;
  for (const auto& entry : weights.tensors()) names.push_back(entry.first);
  CheckWeightNames(
      model,
      [&](const std::string& name) -> std::optional<std::vector<int64_t>> {
        auto it = weights.tensors().find(name);
        if (it == weights.tensors().end()) return std::nullopt;
        return it->second.entry->shape;
      },
      names, weights.description());
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : NamedWeights(model)) {
    const CheckpointWeights::Located& source = weights.tensors().at(name);
    param.copy_(source.file->View(name));
    source.file->Release(name);
  }
}

// A map's shape of `name`, null when absent or undefined (for CheckNames).
std::optional<std::vector<int64_t>> ShapeIn(const std::map<std::string, torch::Tensor>& tensors,
                                            const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end() || !it->second.defined()) return std::nullopt;
  return it->second.sizes().vec();
}

std::vector<std::string> NamesOf(const std::map<std::string, torch::Tensor>& tensors) {
  std::vector<std::string> names;
  for (const auto& entry : tensors) names.push_back(entry.first);
  return names;
}

// Copies `source`'s tensors into `params` of the same names (checked before).
void CopyInto(const std::map<std::string, torch::Tensor>& params,
              const std::map<std::string, torch::Tensor>& source) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    torch::Tensor target = param;
    target.copy_(source.at(name));
  }
}

const char* DtypeName(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32: return "float32";
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    default: break;
  }
  throw std::invalid_argument(std::string("SaveCheckpoint: weights of dtype ") +
                              c10::toString(type) + " cannot be saved (float32, bfloat16, float16)");
}

void CopyCompanionFiles(const std::string& source_dir, const std::string& tmp) {
  std::error_code ec;
  for (const std::string& name : CompanionFiles()) {
    const fs::path from = fs::path(source_dir) / name;
    if (!fs::is_regular_file(from, ec)) continue;
    internal::WriteFileDurably((fs::path(tmp) / name).string(), internal::ReadFile(from.string()));
  }
}

}  // namespace

const std::vector<std::string>& CompanionFiles() {
  static const std::vector<std::string> files = {
      "tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
      "vocab.json",         "merges.txt",            "tokenizer.model",
      "added_tokens.json",  "chat_template.jinja",   "generation_config.json"};
  return files;
}

bool IsAdapterName(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::map<std::string, torch::Tensor> NamedWeights(Decoder& model) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& p : model->named_parameters()) {
    if (!IsAdapterName(p.key())) weights.emplace(p.key(), p.value());
  }
  return weights;
}

std::map<std::string, torch::Tensor> NamedAdapters(Decoder& model) {
  std::map<std::string, torch::Tensor> adapters;
  for (const auto& p : model->named_parameters()) {
    if (IsAdapterName(p.key())) adapters.emplace(p.key(), p.value());
  }
  return adapters;
}

void LoadWeights(Decoder& model, const std::map<std::string, torch::Tensor>& weights) {
  CheckWeightNames(
      model, [&](const std::string& name) { return ShapeIn(weights, name); }, NamesOf(weights),
      "LoadWeights");
  CopyInto(NamedWeights(model), weights);
}

void LoadAdapters(Decoder& model, const std::map<std::string, torch::Tensor>& adapters) {
  if (!model->has_lora()) throw std::logic_error("LoadAdapters: the model has no LoRA adapters");
  CheckNames(
      NamedAdapters(model), [&](const std::string& name) { return ShapeIn(adapters, name); },
      NamesOf(adapters), [](const std::string&) { return false; }, "LoadAdapters");
  CopyInto(NamedAdapters(model), adapters);
}

bool CheckpointExists(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  return fs::is_regular_file(d / kConfigFile, ec) &&
         (fs::is_regular_file(d / kSafetensorsFile, ec) ||
          fs::is_regular_file(d / kSafetensorsIndexFile, ec));
}

void SaveCheckpoint(const std::string& dir, Decoder& model, const SaveOptions& options) {
  std::map<std::string, torch::Tensor> weights = NamedWeights(model);
  const torch::ScalarType dtype = options.dtype.value_or(weights.begin()->second.scalar_type());
  ModelConfig config = model->config();
  config.torch_dtype = DtypeName(dtype);
  if (options.dtype) {
    for (auto& [name, tensor] : weights) tensor = tensor.detach().to(dtype);
  }

  internal::WriteDirectoryAtomically(dir, [&](const std::string& tmp) {
    WriteSafetensorsShards(tmp, weights, options.max_shard_bytes);
    internal::WriteFileDurably((fs::path(tmp) / kConfigFile).string(), config.ToJson());
    if (!config.source_dir.empty()) CopyCompanionFiles(config.source_dir, tmp);
  });
}

ModelConfig ReadModelConfig(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / kConfigFile).string();
  try {
    ModelConfig config = ModelConfig::FromJson(internal::ReadFile(config_path));
    config.source_dir = dir;
    return config;
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(config_path + ": " + e.what());
  }
}

Decoder LoadCheckpoint(const std::string& dir, const LoadOptions& options) {
  if (!CheckpointExists(dir)) {
    throw std::runtime_error("no checkpoint at " + dir + " (needs " + kConfigFile + " and " +
                             kSafetensorsFile + " or " + kSafetensorsIndexFile + ")");
  }
  const ModelConfig config = ReadModelConfig(dir);
  const CheckpointWeights weights = CheckpointWeights::Open(dir);
  Decoder model(config, /*random_init=*/false, Placement{options.device, options.dtype});
  CopyCheckpointWeights(model, weights);
  return model;
}

}  // namespace kappa::model
