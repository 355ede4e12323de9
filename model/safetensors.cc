// safetensors reading and writing (https://github.com/huggingface/safetensors):
// u64 little-endian header size N, N bytes of JSON, then the raw tensor bytes.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/checkpoint.h"
#include "model/file_io.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes; this code copies them verbatim");

namespace kappa::model {
namespace {

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

}  // namespace

void WriteSafetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors) {
  Json header = Json::object();
  std::vector<torch::Tensor> blobs;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__") Fail(path, "invalid tensor name \"" + name + "\"");
    if (!tensor.defined()) Fail(path, "tensor \"" + name + "\" is undefined");
    const DtypeInfo* dtype = FindDtype(tensor.scalar_type());
    if (dtype == nullptr) {
      Fail(path, "tensor \"" + name + "\" has unsupported dtype " +
                     std::string(c10::toString(tensor.scalar_type())));
    }
    auto blob = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(blob.numel()) * dtype->bytes;
    header[name] = {{"dtype", dtype->name},
                    {"shape", blob.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    blobs.push_back(std::move(blob));
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string header_text = header.dump();
  // Pad so the data section starts 8-byte aligned, as the reference writer does.
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');

  std::string file;
  file.reserve(8 + header_text.size() + offset);
  const uint64_t n = header_text.size();
  file.append(reinterpret_cast<const char*>(&n), 8);
  file += header_text;
  for (const auto& blob : blobs) {
    file.append(static_cast<const char*>(blob.data_ptr()), blob.numel() * blob.element_size());
  }
  internal::WriteFileDurably(path, file);
}

std::map<std::string, torch::Tensor> ReadSafetensors(const std::string& path) {
  const std::string file = internal::ReadFile(path);
  if (file.size() < 8) Fail(path, "file is " + std::to_string(file.size()) + " bytes, too short for a header");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  if (n > kMaxHeaderBytes) Fail(path, "header length " + std::to_string(n) + " is implausibly large");
  if (n > file.size() - 8) {
    Fail(path, "header length " + std::to_string(n) + " exceeds the file size " +
                   std::to_string(file.size()));
  }
  Json header;
  try {
    header = Json::parse(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const Json::parse_error& e) {
    Fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) Fail(path, "header is not a JSON object");

  const char* data = file.data() + 8 + n;
  const uint64_t data_size = file.size() - 8 - n;
  std::map<std::string, torch::Tensor> tensors;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
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
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& d : *shape_it) {
      const uint64_t dim = NonNegativeInt(d, path, where + " shape entry");
      if (dim > 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim) {
        Fail(path, where + " shape is too large");
      }
      numel *= dim;
      shape.push_back(static_cast<int64_t>(dim));
    }
    if (!offsets_it->is_array() || offsets_it->size() != 2) {
      Fail(path, where + " data_offsets must be [begin, end]");
    }
    const uint64_t begin = NonNegativeInt((*offsets_it)[0], path, where + " data_offsets[0]");
    const uint64_t end = NonNegativeInt((*offsets_it)[1], path, where + " data_offsets[1]");
    if (begin > end || end > data_size) {
      Fail(path, where + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] fall outside the " + std::to_string(data_size) + "-byte data section");
    }
    if (end - begin != numel * dtype->bytes) {
      Fail(path, where + " has " + std::to_string(end - begin) + " bytes but its shape and dtype need " +
                     std::to_string(numel * dtype->bytes));
    }
    ranges.emplace_back(begin, end);
    auto tensor = torch::empty(shape, torch::TensorOptions().dtype(dtype->type));
    if (end > begin) std::memcpy(tensor.data_ptr(), data + begin, end - begin);
    tensors.emplace(name, std::move(tensor));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) Fail(path, "tensor data ranges overlap");
  }
  return tensors;
}

}  // namespace kappa::model
