#include "model/checkpoint.h"

#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <fcntl.h>
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

constexpr char kWeightsFile[] = "model.safetensors";
constexpr char kConfigFile[] = "config.json";

std::string Shape(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
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

std::string StripTrailingSlashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

[[noreturn]] void FailErrno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

}  // namespace

std::map<std::string, torch::Tensor> NamedWeights(Decoder& model) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& p : model->named_parameters()) weights.emplace(p.key(), p.value());
  return weights;
}

void LoadWeights(Decoder& model, const std::map<std::string, torch::Tensor>& weights) {
  const bool tied = model->config().tie_word_embeddings;
  auto params = model->named_parameters();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& p : params) {
    auto it = weights.find(p.key());
    if (it == weights.end()) {
      missing.push_back(p.key());
    } else if (!it->second.defined() || it->second.sizes() != p.value().sizes()) {
      mismatched.push_back(p.key() + " (expected " + Shape(p.value()) + ", got " +
                           (it->second.defined() ? Shape(it->second) : "undefined") + ")");
    }
  }
  for (const auto& [name, tensor] : weights) {
    if (params.find(name) == nullptr && !IsIgnorable(name, tied)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string msg = "LoadWeights:";
    if (!missing.empty()) msg += " missing [" + Join(missing) + "];";
    if (!unexpected.empty()) msg += " unexpected [" + Join(unexpected) + "];";
    if (!mismatched.empty()) msg += " shape mismatch [" + Join(mismatched) + "];";
    msg.pop_back();
    throw std::runtime_error(msg);
  }
  torch::NoGradGuard no_grad;
  for (auto& p : params) p.value().copy_(weights.at(p.key()));
}

bool CheckpointExists(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kWeightsFile, ec) &&
         fs::is_regular_file(fs::path(dir) / kConfigFile, ec);
}

void SaveCheckpoint(const std::string& dir_in, Decoder& model) {
  const std::string dir = StripTrailingSlashes(dir_in);
  const fs::path target(dir);
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  fs::create_directories(parent);

  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  try {
    WriteSafetensors((fs::path(tmp) / kWeightsFile).string(), NamedWeights(model));
    internal::WriteFileDurably((fs::path(tmp) / kConfigFile).string(), model->config().ToJson());
    internal::SyncDirectory(tmp);

    std::error_code ec;
    if (!fs::exists(target, ec)) {
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
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

Decoder LoadCheckpoint(const std::string& dir) {
  if (!CheckpointExists(dir)) {
    throw std::runtime_error("no checkpoint at " + dir + " (needs " + kConfigFile + " and " +
                             kWeightsFile + ")");
  }
  const std::string config_path = (fs::path(dir) / kConfigFile).string();
  ModelConfig config;
  try {
    config = ModelConfig::FromJson(internal::ReadFile(config_path));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(config_path + ": " + e.what());
  }
  Decoder model(config);
  const std::string weights_path = (fs::path(dir) / kWeightsFile).string();
  try {
    LoadWeights(model, ReadSafetensors(weights_path));
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    if (what.find(weights_path) != std::string::npos) throw;
    throw std::runtime_error(weights_path + ": " + what);
  }
  return model;
}

}  // namespace kappa::model
