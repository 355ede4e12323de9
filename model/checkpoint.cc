#include "model/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "model/file_io.h"

namespace kappa::model {
namespace {

namespace fs = std::filesystem;

constexpr char kConfigFile[] = "config.json";

std::string Shape(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

std::string Join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// Names HF checkpoints may carry that hold no parameter of ours.
bool IsIgnorable(const std::string& name, bool tied) {
  if (tied && name == "lm_head.weight") return true;  // the embedding again
  const std::string inv_freq = "rotary_emb.inv_freq";  // older HF versions saved it
  return name.size() >= inv_freq.size() &&
         name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
}

// Every parameter present with its shape and nothing unexpected, or a
// runtime_error listing each problem. `shape_of(name)` is null when absent.
template <typename ShapeOf, typename Names>
void CheckWeightNames(Decoder& model, const ShapeOf& shape_of, const Names& names,
                      const std::string& where) {
  const bool tied = model->config().tie_word_embeddings;
  auto params = model->named_parameters();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& p : params) {
    const std::optional<std::vector<int64_t>> shape = shape_of(p.key());
    if (!shape) {
      missing.push_back(p.key());
    } else if (at::IntArrayRef(*shape) != p.value().sizes()) {
      mismatched.push_back(p.key() + " (expected " + Shape(p.value().sizes()) + ", got " +
                           Shape(*shape) + ")");
    }
  }
  for (const auto& name : names) {
    if (params.find(name) == nullptr && !IsIgnorable(name, tied)) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;
  std::string msg = where + ":";
  if (!missing.empty()) msg += " missing [" + Join(missing) + "];";
  if (!unexpected.empty()) msg += " unexpected [" + Join(unexpected) + "];";
  if (!mismatched.empty()) msg += " shape mismatch [" + Join(mismatched) + "];";
  msg.pop_back();
  throw std::runtime_error(msg);
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
  for (auto& p : model->named_parameters()) {
    const CheckpointWeights::Located& source = weights.tensors().at(p.key());
    p.value().copy_(source.file->View(p.key()));
    source.file->Release(p.key());
  }
}

std::string StripTrailingSlashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

[[noreturn]] void FailErrno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
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

// Files go to `tmp`, then the directory is swapped in for `dir`.
void PublishDirectory(const std::string& tmp, const std::string& dir, const fs::path& parent) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0) FailErrno("cannot rename " + tmp + " to " + dir);
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    // Readers see either the old or the new checkpoint, never neither;
    // the old one now sits at `tmp`.
    fs::remove_all(tmp);
  } else {
    // Filesystems without RENAME_EXCHANGE: a short window without `dir`.
    const std::string old = dir + ".old-" + std::to_string(::getpid());
    fs::remove_all(old);
    if (::rename(dir.c_str(), old.c_str()) != 0) FailErrno("cannot move aside " + dir);
    if (::rename(tmp.c_str(), dir.c_str()) != 0) FailErrno("cannot rename " + tmp + " to " + dir);
    fs::remove_all(old);
  }
  internal::SyncDirectory(parent.string());
}

}  // namespace

const std::vector<std::string>& CompanionFiles() {
  static const std::vector<std::string> files = {
      "tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
      "vocab.json",         "merges.txt",            "tokenizer.model",
      "added_tokens.json",  "chat_template.jinja",   "generation_config.json"};
  return files;
}

std::map<std::string, torch::Tensor> NamedWeights(Decoder& model) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& p : model->named_parameters()) weights.emplace(p.key(), p.value());
  return weights;
}

void LoadWeights(Decoder& model, const std::map<std::string, torch::Tensor>& weights) {
  std::vector<std::string> names;
  for (const auto& entry : weights) names.push_back(entry.first);
  CheckWeightNames(
      model,
      [&](const std::string& name) -> std::optional<std::vector<int64_t>> {
        auto it = weights.find(name);
        if (it == weights.end() || !it->second.defined()) return std::nullopt;
        return it->second.sizes().vec();
      },
      names, "LoadWeights");
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) p.value().copy_(weights.at(p.key()));
}

bool CheckpointExists(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  return fs::is_regular_file(d / kConfigFile, ec) &&
         (fs::is_regular_file(d / kSafetensorsFile, ec) ||
          fs::is_regular_file(d / kSafetensorsIndexFile, ec));
}

void SaveCheckpoint(const std::string& dir_in, Decoder& model, const SaveOptions& options) {
  const std::string dir = StripTrailingSlashes(dir_in);
  const fs::path target(dir);
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  fs::create_directories(parent);

  std::map<std::string, torch::Tensor> weights = NamedWeights(model);
  const torch::ScalarType dtype = options.dtype.value_or(weights.begin()->second.scalar_type());
  ModelConfig config = model->config();
  config.torch_dtype = DtypeName(dtype);
  if (options.dtype) {
    for (auto& [name, tensor] : weights) tensor = tensor.detach().to(dtype);
  }

  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  try {
    WriteSafetensorsShards(tmp, weights, options.max_shard_bytes);
    internal::WriteFileDurably((fs::path(tmp) / kConfigFile).string(), config.ToJson());
    if (!config.source_dir.empty()) CopyCompanionFiles(config.source_dir, tmp);
    internal::SyncDirectory(tmp);
    PublishDirectory(tmp, dir, parent);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
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
