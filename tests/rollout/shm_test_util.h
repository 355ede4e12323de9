// Shared by the shared-memory weight-sync test and its fixture processes
// (shm_sync_test.cc, shm_sync_fixture.cc): what version v's weights are, and
// a checksum that says whether a model holds exactly one version.
#pragma once

#include <dirent.h>
#include <torch/types.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "tests/rollout/test_policy.h"
#include "tests/rollout/weight_test_util.h"

namespace kappa::rollout::testing {

// Version v's float32 weights (TinyConfig), the same in every process.
inline Weights VersionWeights(int64_t version) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 1000 + static_cast<uint64_t>(version));
  return CopyWeights(decoder);
}

// FNV-1a over every parameter's name and float32 bytes, in name order.
inline uint64_t Checksum(const Weights& weights) {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&hash](const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  };
  for (const auto& [name, tensor] : weights) {
    mix(name.data(), name.size());
    const torch::Tensor t = tensor.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    mix(t.data_ptr(), static_cast<size_t>(t.numel()) * sizeof(float));
  }
  return hash;
}

inline uint64_t ModelChecksum(model::Decoder& model) {
  return Checksum(model::NamedWeights(model));
}

// Names of the kappa-* segments in `dir` (whoever wrote them).
inline std::vector<std::string> ShmSegments(const std::string& dir = "/dev/shm") {
  std::vector<std::string> names;
  if (DIR* listing = opendir(dir.c_str())) {
    while (dirent* entry = readdir(listing)) {
      if (std::strncmp(entry->d_name, "kappa-", 6) == 0) names.emplace_back(entry->d_name);
    }
    closedir(listing);
  }
  return names;
}

// Those of process `pid` (kappa-<pid>-...).
inline std::vector<std::string> ShmSegmentsOf(int pid, const std::string& dir = "/dev/shm") {
  const std::string prefix = "kappa-" + std::to_string(pid) + "-";
  std::vector<std::string> mine;
  for (const std::string& name : ShmSegments(dir)) {
    if (name.rfind(prefix, 0) == 0) mine.push_back(name);
  }
  return mine;
}

}  // namespace kappa::rollout::testing
