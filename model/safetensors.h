// safetensors files (https://github.com/huggingface/safetensors): u64
// little-endian header size N, N bytes of JSON {name: {dtype, shape,
// data_offsets}, "__metadata__": {...}}, then the raw tensor bytes. The one
// place kappa reads and writes the format. F32, BF16, F16, I32 and I64.
// Errors are std::runtime_error naming the file (and the tensor).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kappa::model {

// A read-only memory map of one safetensors file. Open() validates the whole
// header (dtypes, shapes, offsets inside the data section, no overlaps)
// before anything is read, so a truncated file or a header longer than the
// file fails there. The mapping lives as long as this object.
class SafetensorsFile {
 public:
  struct Entry {
    torch::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets in the data section
    uint64_t end = 0;
  };

  static std::unique_ptr<SafetensorsFile> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }

  // A CPU tensor over the mapped bytes (no copy; read-only: writing to it is
  // undefined). REQUIRES: `name` is in entries(). Valid while *this lives.
  torch::Tensor View(const std::string& name) const;
  // Drops the mapped pages of `name` from this process's resident set (the
  // page cache keeps them), so copying tensor after tensor out of a large
  // file holds about one tensor's pages at a time. Later View()s re-read.
  void Release(const std::string& name) const;

 private:
  SafetensorsFile(std::string path, const char* map, size_t size);
  std::string path_;
  const char* map_ = nullptr;
  size_t size_ = 0;
  const char* data_ = nullptr;  // start of the data section
  std::map<std::string, Entry> entries_;
};

// Writes `tensors` (each copied to the CPU one at a time, streamed to the
// file) and fsyncs the file before returning.
void WriteSafetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors);
// Every tensor copied out of the file (small files: optimizer-free state, tests).
std::map<std::string, torch::Tensor> ReadSafetensors(const std::string& path);

// The safetensors weights of a Hugging Face model directory: either
// `model.safetensors`, or the shards that `model.safetensors.index.json`
// ("weight_map": {tensor: file}) names. Every shard is opened (and its header
// validated) up front; a tensor the index maps to a file that lacks it, or a
// shard tensor the index does not list, is an error naming both.
class CheckpointWeights {
 public:
  static CheckpointWeights Open(const std::string& dir);
  // name -> (file, entry) for every tensor of the checkpoint.
  struct Located {
    const SafetensorsFile* file;
    const SafetensorsFile::Entry* entry;
  };
  const std::map<std::string, Located>& tensors() const { return tensors_; }
  // Where the weights came from: model.safetensors or the index file.
  const std::string& description() const { return description_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Located> tensors_;
  std::string description_;
};

// Writes `tensors` into `dir` as Hugging Face does: one `model.safetensors`
// when they fit in `max_shard_bytes`, otherwise `model-0000i-of-0000n.safetensors`
// shards (each at most max_shard_bytes unless one tensor alone is larger) and
// `model.safetensors.index.json` with metadata.total_size and weight_map.
// Files are fsynced; `dir` must exist.
void WriteSafetensorsShards(const std::string& dir,
                            const std::map<std::string, torch::Tensor>& tensors,
                            uint64_t max_shard_bytes);

inline constexpr char kSafetensorsFile[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";
// transformers' default max_shard_size ("5GB").
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

}  // namespace kappa::model
