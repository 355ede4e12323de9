// safetensors reading (memory-mapped) and writing (streamed), single files
// and Hugging Face shard sets.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "model/file_io.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes; this code copies them verbatim");

namespace kappa::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Far above any real header, low enough to refuse garbage before allocating.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeInfo {
  const char* name;
  torch::ScalarType type;
  size_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {"F32", torch::kFloat32, 4}, {"BF16", torch::kBFloat16, 2}, {"F16", torch::kFloat16, 2},
    {"I32", torch::kInt32, 4},   {"I64", torch::kInt64, 8},
};

const DtypeInfo* FindDtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeInfo* FindDtype(torch::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

[[noreturn]] void Fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("safetensors " + path + ": " + what);
}

uint64_t NonNegativeInt(const Json& v, const std::string& path, const std::string& what) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    Fail(path, what + " must be a non-negative integer, got " + v.dump());
  }
  return v.get<uint64_t>();
}

// One header entry, checked against the data section's size.
SafetensorsFile::Entry ParseEntry(const std::string& path, const std::string& name,
                                  const Json& entry, uint64_t data_size) {
  const std::string where = "tensor \"" + name + "\"";
  if (!entry.is_object()) Fail(path, where + " entry is not an object");
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || shape_it == entry.end() || offsets_it == entry.end()) {
    Fail(path, where + " needs dtype, shape and data_offsets");
  }
  if (!dtype_it->is_string()) Fail(path, where + " dtype is not a string");
  const DtypeInfo* dtype = FindDtype(dtype_it->get<std::string>());
  if (dtype == nullptr) {
    Fail(path, where + " has unsupported dtype \"" + dtype_it->get<std::string>() +
                   "\" (supported: F32, BF16, F16, I32, I64)");
  }
  if (!shape_it->is_array()) Fail(path, where + " shape is not an array");
  SafetensorsFile::Entry e;
  e.dtype = dtype->type;
  uint64_t numel = 1;
  for (const auto& d : *shape_it) {
    const uint64_t dim = NonNegativeInt(d, path, where + " shape entry");
    if (dim > 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim) {
      Fail(path, where + " shape is too large");
    }
    numel *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    Fail(path, where + " data_offsets must be [begin, end]");
  }
  e.begin = NonNegativeInt((*offsets_it)[0], path, where + " data_offsets[0]");
  e.end = NonNegativeInt((*offsets_it)[1], path, where + " data_offsets[1]");
  if (e.begin > e.end || e.end > data_size) {
    Fail(path, where + " data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                   "] fall outside the " + std::to_string(data_size) +
                   "-byte data section (truncated file?)");
  }
  if (e.end - e.begin != numel * dtype->bytes) {
    Fail(path, where + " has " + std::to_string(e.end - e.begin) +
                   " bytes but its shape and dtype need " + std::to_string(numel * dtype->bytes));
  }
  return e;
}

std::string HeaderText(const std::map<std::string, torch::Tensor>& tensors, const std::string& path) {
  Json header = Json::object();
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__") Fail(path, "invalid tensor name \"" + name + "\"");
    if (!tensor.defined()) Fail(path, "tensor \"" + name + "\" is undefined");
    const DtypeInfo* dtype = FindDtype(tensor.scalar_type());
    if (dtype == nullptr) {
      Fail(path, "tensor \"" + name + "\" has unsupported dtype " +
                     std::string(c10::toString(tensor.scalar_type())));
    }
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * dtype->bytes;
    header[name] = {{"dtype", dtype->name},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  // Pad so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  return text;
}

uint64_t ByteSize(const torch::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path, const char* map, size_t size)
    : path_(std::move(path)), map_(map), size_(size) {}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<char*>(map_), size_);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int saved = errno;
    ::close(fd);
    Fail(path, std::string("cannot stat: ") + std::strerror(saved));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    Fail(path, "file is " + std::to_string(size) + " bytes, too short for a header");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int saved = errno;
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) Fail(path, std::string("cannot mmap: ") + std::strerror(saved));
  std::unique_ptr<SafetensorsFile> file(
      new SafetensorsFile(path, static_cast<const char*>(map), size));

  uint64_t n = 0;
  std::memcpy(&n, file->map_, 8);
  if (n > kMaxHeaderBytes) Fail(path, "header length " + std::to_string(n) + " is implausibly large");
  if (n > size - 8) {
    Fail(path, "header length " + std::to_string(n) + " exceeds the file size " + std::to_string(size));
  }
  Json header;
  try {
    header = Json::parse(file->map_ + 8, file->map_ + 8 + n);
  } catch (const Json::parse_error& e) {
    Fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) Fail(path, "header is not a JSON object");
  file->data_ = file->map_ + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    Entry e = ParseEntry(path, name, entry, data_size);
    ranges.emplace_back(e.begin, e.end);
    file->entries_.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) Fail(path, "tensor data ranges overlap");
  }
  return file;
}

torch::Tensor SafetensorsFile::View(const std::string& name) const {
  const Entry& e = entries_.at(name);
  // from_blob wants a mutable pointer; the tensor is only ever read.
  void* bytes = const_cast<char*>(data_ + e.begin);
  if (e.end == e.begin) return torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
  // Unaligned data (a writer that did not pad its header) is copied: views
  // of misaligned memory are not safe for vectorized kernels.
  const auto options = torch::TensorOptions().dtype(e.dtype);
  if (reinterpret_cast<uintptr_t>(bytes) % c10::elementSize(e.dtype) != 0) {
    auto copy = torch::empty(e.shape, options);
    std::memcpy(copy.data_ptr(), bytes, e.end - e.begin);
    return copy;
  }
  return torch::from_blob(bytes, e.shape, options);
}

void SafetensorsFile::Release(const std::string& name) const {
  const Entry& e = entries_.at(name);
  const long page = ::sysconf(_SC_PAGESIZE);
  const uintptr_t base = reinterpret_cast<uintptr_t>(map_);
  uintptr_t begin = reinterpret_cast<uintptr_t>(data_ + e.begin);
  uintptr_t end = reinterpret_cast<uintptr_t>(data_ + e.end);
  begin = base + (begin - base) / static_cast<uintptr_t>(page) * static_cast<uintptr_t>(page);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void WriteSafetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors) {
  const std::string header = HeaderText(tensors, path);
  internal::DurableFileWriter writer(path);
  const uint64_t n = header.size();
  writer.Append(std::string_view(reinterpret_cast<const char*>(&n), 8));
  writer.Append(header);
  for (const auto& [name, tensor] : tensors) {
    auto blob = tensor.detach().to(torch::kCPU).contiguous();
    writer.Append(std::string_view(static_cast<const char*>(blob.data_ptr()), ByteSize(blob)));
  }
  writer.Finish();
}

std::map<std::string, torch::Tensor> ReadSafetensors(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [name, entry] : file->entries()) tensors.emplace(name, file->View(name).clone());
  return tensors;
}

CheckpointWeights CheckpointWeights::Open(const std::string& dir) {
  CheckpointWeights weights;
  const fs::path index_path = fs::path(dir) / kSafetensorsIndexFile;
  std::error_code ec;
  if (!fs::is_regular_file(index_path, ec)) {
    const std::string path = (fs::path(dir) / kSafetensorsFile).string();
    weights.files_.push_back(SafetensorsFile::Open(path));
    weights.description_ = path;
    for (const auto& [name, entry] : weights.files_[0]->entries()) {
      weights.tensors_.emplace(name, Located{weights.files_[0].get(), &entry});
    }
    return weights;
  }
  const std::string index = index_path.string();
  weights.description_ = index;
  Json j;
  try {
    j = Json::parse(internal::ReadFile(index));
  } catch (const Json::exception& e) {
    throw std::runtime_error(index + ": not valid JSON: " + e.what());
  }
  auto map_it = j.find("weight_map");
  if (!j.is_object() || map_it == j.end() || !map_it->is_object()) {
    throw std::runtime_error(index + ": needs an object \"weight_map\": {tensor: shard file}");
  }
  std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
  for (const auto& [name, file] : map_it->items()) {
    if (!file.is_string()) throw std::runtime_error(index + ": weight_map[\"" + name + "\"] is not a file name");
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos) {
      throw std::runtime_error(index + ": weight_map[\"" + name + "\"] = \"" + shard +
                               "\" is not a file name in the directory");
    }
    auto& open = shards[shard];
    if (!open) {
      const fs::path shard_path = fs::path(dir) / shard;
      if (!fs::is_regular_file(shard_path, ec)) {
        throw std::runtime_error(index + ": tensor \"" + name + "\" is in shard " + shard +
                                 ", which does not exist (" + shard_path.string() + ")");
      }
      open = SafetensorsFile::Open(shard_path.string());
      weights.files_.push_back(open);
    }
    auto entry = open->entries().find(name);
    if (entry == open->entries().end()) {
      throw std::runtime_error(index + ": tensor \"" + name + "\" is mapped to " + open->path() +
                               ", which does not hold it");
    }
    weights.tensors_.emplace(name, Located{open.get(), &entry->second});
  }
  for (const auto& [shard, file] : shards) {
    for (const auto& [name, entry] : file->entries()) {
      auto it = weights.tensors_.find(name);
      if (it == weights.tensors_.end() || it->second.file != file.get()) {
        throw std::runtime_error(index + ": " + file->path() + " holds tensor \"" + name +
                                 "\", which the index does not map to it");
      }
    }
  }
  return weights;
}

void WriteSafetensorsShards(const std::string& dir,
                            const std::map<std::string, torch::Tensor>& tensors,
                            uint64_t max_shard_bytes) {
  // transformers' shard_checkpoint: fill shards in order, start a new one
  // when the next tensor would overflow the current one.
  std::vector<std::map<std::string, torch::Tensor>> shards(1);
  uint64_t current = 0, total = 0;
  for (const auto& [name, tensor] : tensors) {
    const uint64_t bytes = ByteSize(tensor);
    if (current > 0 && current + bytes > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().emplace(name, tensor);
    current += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    WriteSafetensors((fs::path(dir) / kSafetensorsFile).string(), shards[0]);
    return;
  }
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    WriteSafetensors((fs::path(dir) / name).string(), shards[i]);
    for (const auto& entry : shards[i]) weight_map[entry.first] = name;
  }
  const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  internal::WriteFileDurably((fs::path(dir) / kSafetensorsIndexFile).string(), index.dump(2) + "\n");
}

}  // namespace kappa::model
