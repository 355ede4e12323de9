#include "dist/shm_segment.h"

#include <ATen/Parallel.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "services/torch_tensor_codec.h"

namespace kappa::dist {
namespace {

constexpr char kMagic[8] = {'K', 'A', 'P', 'P', 'A', 'S', 'H', 'M'};
constexpr uint32_t kFormat = 1;
constexpr int64_t kHeaderBytes = 64;
constexpr int64_t kTensorAlign = 64;
constexpr int64_t kDataAlign = 4096;
// Elements per piece of the parallel copy: large enough to stream, small
// enough that two threads share a big tensor.
constexpr int64_t kPieceElements = int64_t{1} << 20;

struct ShmHeader {
  char magic[8];
  uint32_t format;
  int32_t dtype;  // kappa::v1::DType
  uint64_t token;
  int64_t version;
  uint64_t policy_id;
  int64_t manifest_bytes;
  int64_t data_offset;
  int64_t total_bytes;
};
static_assert(sizeof(ShmHeader) == kHeaderBytes);

int64_t AlignUp(int64_t value, int64_t align) { return (value + align - 1) / align * align; }

absl::Status Errno(const std::string& what, int error) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  if (error == ENOSPC || error == ENOMEM) return absl::ResourceExhaustedError(message);
  if (error == ENOENT) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

uint64_t RandomToken() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// Links the unnamed file `fd` as `path`: through /proc/self/fd (no
// capability needed), else AT_EMPTY_PATH (needs CAP_DAC_READ_SEARCH).
absl::Status LinkAs(int fd, const std::string& path) {
  const std::string proc = absl::StrCat("/proc/self/fd/", fd);
  if (linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) == 0) {
    return absl::OkStatus();
  }
  const int first = errno;
  if (first == EEXIST || first == ENOSPC) return Errno("linkat " + path, first);
  if (linkat(fd, "", AT_FDCWD, path.c_str(), AT_EMPTY_PATH) == 0) return absl::OkStatus();
  return Errno("linkat " + path, first);
}

// A range of one tensor's elements, the unit of the parallel reads and writes.
struct Piece {
  int tensor;
  int64_t start;
  int64_t length;
};

std::vector<Piece> Pieces(const std::vector<int64_t>& numels) {
  std::vector<Piece> pieces;
  for (int t = 0; t < static_cast<int>(numels.size()); ++t) {
    for (int64_t at = 0; at < numels[t]; at += kPieceElements) {
      pieces.push_back({t, at, std::min(kPieceElements, numels[t] - at)});
    }
  }
  return pieces;
}

// Runs `work` on every piece over the intra-op threads; the first error wins.
absl::Status ForEachPiece(const std::vector<Piece>& pieces,
                          const std::function<absl::Status(const Piece&)>& work) {
  absl::Mutex mu;
  absl::Status first = absl::OkStatus();
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      absl::Status status;
      try {
        status = work(pieces[i]);
      } catch (const std::exception& e) {
        status = absl::InternalError(e.what());
      }
      if (!status.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = status;
        return;
      }
    }
  });
  return first;
}

absl::Status WriteAll(int fd, const char* data, int64_t size, int64_t offset) {
  while (size > 0) {
    const ssize_t n = pwrite(fd, data, static_cast<size_t>(size), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("pwrite", n < 0 ? errno : EIO);
    data += n;
    size -= n;
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, int64_t size, int64_t offset) {
  while (size > 0) {
    const ssize_t n = pread(fd, data, static_cast<size_t>(size), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? Errno("pread", errno) : absl::DataLossError("pread: end of file");
    data += n;
    size -= n;
    offset += n;
  }
  return absl::OkStatus();
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::string> ShmHostKey(const std::string& dir) {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!(boot >> boot_id) || boot_id.empty()) {
    return absl::UnavailableError("cannot read /proc/sys/kernel/random/boot_id");
  }
  struct stat info {};
  if (stat(dir.c_str(), &info) != 0) return Errno("stat " + dir, errno);
  return absl::StrCat(boot_id, ":", static_cast<uint64_t>(info.st_dev), ":",
                      static_cast<uint64_t>(info.st_ino));
}

std::vector<int64_t> ShmOffsets(const kappa::v1::WeightGroupManifest& manifest,
                                int64_t data_offset) {
  const absl::StatusOr<torch::ScalarType> dtype = services::ToTorchDType(manifest.dtype());
  const int64_t element = dtype.ok() ? static_cast<int64_t>(torch::elementSize(*dtype)) : 0;
  std::vector<int64_t> offsets;
  int64_t at = data_offset;
  for (const auto& parameter : manifest.parameters()) {
    at = AlignUp(at, kTensorAlign);
    offsets.push_back(at);
    int64_t numel = 1;
    for (int64_t size : parameter.shape()) numel *= size;
    at += numel * element;
  }
  offsets.push_back(at);
  return offsets;
}

ShmSegment::ShmSegment(std::string path, uint64_t token, int64_t bytes, void* base,
                       std::vector<std::pair<std::string, torch::Tensor>> views)
    : path_(std::move(path)), token_(token), bytes_(bytes), base_(base), views_(std::move(views)) {}

ShmSegment::~ShmSegment() { munmap(base_, static_cast<size_t>(bytes_)); }

namespace {

kappa::v1::WeightGroupManifest ManifestOf(const ShmContent& content) {
  kappa::v1::WeightGroupManifest manifest;
  manifest.set_version(content.version);
  manifest.set_policy_id(content.policy_id);
  manifest.set_model_config_json(content.model_config_json);
  manifest.set_dtype(services::ToWireDType(content.dtype));
  for (const auto& [parameter_name, tensor] : *content.weights) {
    auto* parameter = manifest.add_parameters();
    parameter->set_name(parameter_name);
    for (int64_t size : tensor.sizes()) parameter->add_shape(size);
  }
  return manifest;
}

}  // namespace

int64_t ShmSegmentBytes(const ShmContent& content) {
  const kappa::v1::WeightGroupManifest manifest = ManifestOf(content);
  const int64_t data_offset =
      AlignUp(kHeaderBytes + static_cast<int64_t>(manifest.ByteSizeLong()), kDataAlign);
  return std::max<int64_t>(ShmOffsets(manifest, data_offset).back(), data_offset);
}

absl::StatusOr<int> PrepareShmFile(const std::string& dir, int64_t bytes) {
  Fd fd(open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (fd.get() < 0) return Errno("open(O_TMPFILE) in " + dir, errno);
  if (ftruncate(fd.get(), bytes) != 0) return Errno("ftruncate in " + dir, errno);
  const std::string zeros(8 << 20, '\0');
  for (int64_t at = 0; at < bytes; at += static_cast<int64_t>(zeros.size())) {
    KAPPA_RETURN_IF_ERROR(
        WriteAll(fd.get(), zeros.data(),
                 std::min<int64_t>(static_cast<int64_t>(zeros.size()), bytes - at), at));
  }
  return fd.release();
}

absl::StatusOr<std::shared_ptr<const ShmSegment>> WriteShmSegment(const std::string& dir,
                                                                  const std::string& name,
                                                                  const ShmContent& content,
                                                                  int prepared) {
  Fd prepared_fd(prepared);
  if (content.weights == nullptr) return absl::InvalidArgumentError("no weights to write");
  const kappa::v1::WeightGroupManifest manifest = ManifestOf(content);
  const std::string manifest_bytes = manifest.SerializeAsString();
  const int64_t data_offset =
      AlignUp(kHeaderBytes + static_cast<int64_t>(manifest_bytes.size()), kDataAlign);
  const std::vector<int64_t> offsets = ShmOffsets(manifest, data_offset);
  const int64_t total = std::max<int64_t>(offsets.back(), data_offset);

  struct stat prepared_info {};
  const bool use_prepared = prepared_fd.get() >= 0 &&
                            fstat(prepared_fd.get(), &prepared_info) == 0 &&
                            prepared_info.st_size == total;
  const Fd fd(use_prepared ? prepared_fd.release()
                           : open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (fd.get() < 0) return Errno("open(O_TMPFILE) in " + dir, errno);
  const std::string path = dir + "/" + name;

  ShmHeader header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.format = kFormat;
  header.dtype = static_cast<int32_t>(manifest.dtype());
  header.token = RandomToken();
  header.version = content.version;
  header.policy_id = content.policy_id;
  header.manifest_bytes = static_cast<int64_t>(manifest_bytes.size());
  header.data_offset = data_offset;
  header.total_bytes = total;
  std::string head(static_cast<size_t>(data_offset), '\0');
  std::memcpy(head.data(), &header, sizeof(header));
  std::memcpy(head.data() + kHeaderBytes, manifest_bytes.data(), manifest_bytes.size());
  if (ftruncate(fd.get(), total) != 0) return Errno("ftruncate " + path, errno);
  KAPPA_RETURN_IF_ERROR(WriteAll(fd.get(), head.data(), data_offset, 0));

  // Contiguous CPU sources; pieces already in `dtype` are written as they
  // are, the others converted through a buffer per piece.
  std::vector<torch::Tensor> sources;
  std::vector<int64_t> numels;
  for (const auto& [parameter_name, tensor] : *content.weights) {
    sources.push_back(tensor.to(torch::kCPU).contiguous());
    numels.push_back(tensor.numel());
  }
  const int64_t element = static_cast<int64_t>(torch::elementSize(content.dtype));
  torch::NoGradGuard no_grad;
  absl::Status written = ForEachPiece(Pieces(numels), [&](const Piece& piece) {
    const torch::Tensor& source = sources[piece.tensor];
    const int64_t offset = offsets[piece.tensor] + piece.start * element;
    const int64_t size = piece.length * element;
    if (source.scalar_type() == content.dtype) {
      return WriteAll(fd.get(), static_cast<const char*>(source.data_ptr()) + piece.start * element,
                      size, offset);
    }
    const torch::Tensor converted =
        source.view({-1}).narrow(0, piece.start, piece.length).to(content.dtype);
    return WriteAll(fd.get(), static_cast<const char*>(converted.data_ptr()), size, offset);
  });
  if (!written.ok()) {
    return absl::Status(written.code(), absl::StrCat("writing ", path, ": ", written.message()));
  }
  KAPPA_RETURN_IF_ERROR(LinkAs(fd.get(), path));

  // The encoding's views: a read-only mapping, faulted in only if read.
  void* base = mmap(nullptr, static_cast<size_t>(total), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    unlink(path.c_str());
    return Errno("mmap " + path, error);
  }
  std::vector<std::pair<std::string, torch::Tensor>> views;
  for (size_t p = 0; p < content.weights->size(); ++p) {
    views.emplace_back((*content.weights)[p].first,
                       torch::from_blob(static_cast<char*>(base) + offsets[p],
                                        (*content.weights)[p].second.sizes(),
                                        torch::TensorOptions().dtype(content.dtype)));
  }
  return std::make_shared<const ShmSegment>(path, header.token, total, base, std::move(views));
}

OpenShmSegment::OpenShmSegment(int fd, std::string path, kappa::v1::WeightGroupManifest manifest,
                               torch::ScalarType dtype, std::vector<int64_t> offsets)
    : fd_(fd),
      path_(std::move(path)),
      manifest_(std::move(manifest)),
      dtype_(dtype),
      offsets_(std::move(offsets)) {}

OpenShmSegment::~OpenShmSegment() { close(fd_); }

absl::Status OpenShmSegment::ReadInto(
    const std::vector<std::pair<torch::Tensor, int>>& reads) const {
  std::vector<int64_t> numels;
  for (const auto& [destination, index] : reads) numels.push_back(destination.numel());
  const int64_t element = static_cast<int64_t>(torch::elementSize(dtype_));
  torch::NoGradGuard no_grad;
  absl::Status status = ForEachPiece(Pieces(numels), [&](const Piece& piece) {
    const auto& [destination, index] = reads[piece.tensor];
    const int64_t offset = offsets_[index] + piece.start * element;
    const int64_t size = piece.length * element;
    if (destination.device().is_cpu() && destination.scalar_type() == dtype_ &&
        destination.is_contiguous()) {
      return ReadAll(fd_, static_cast<char*>(destination.data_ptr()) + piece.start * element, size,
                     offset);
    }
    torch::Tensor buffer = torch::empty({piece.length}, torch::TensorOptions().dtype(dtype_));
    KAPPA_RETURN_IF_ERROR(ReadAll(fd_, static_cast<char*>(buffer.data_ptr()), size, offset));
    destination.view({-1}).narrow(0, piece.start, piece.length).copy_(buffer);
    return absl::OkStatus();
  });
  if (!status.ok()) return absl::DataLossError(absl::StrCat(path_, ": ", status.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OpenShmSegment>> OpenShmSegmentFor(const std::string& path,
                                                                  int64_t bytes, uint64_t token,
                                                                  int64_t version,
                                                                  uint64_t policy_id) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || path.compare(slash + 1, 6, kShmPrefix) != 0 ||
      path.find("/../") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm_path: '", path, "' is not a kappa- segment in a directory"));
  }
  if (bytes < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shm_bytes: ", bytes, " is below the header"));
  }
  const int raw = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return Errno("open " + path, errno);
  Fd fd(raw);
  struct stat info {};
  if (fstat(fd.get(), &info) != 0) return Errno("fstat " + path, errno);
  if (info.st_size != bytes) {
    return absl::DataLossError(
        absl::StrCat(path, " has ", info.st_size, " bytes, not shm_bytes ", bytes));
  }
  ShmHeader header{};
  KAPPA_RETURN_IF_ERROR(ReadAll(fd.get(), reinterpret_cast<char*>(&header), sizeof(header), 0));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0 || header.format != kFormat) {
    return absl::DataLossError(path + " is not a kappa policy segment (magic, format)");
  }
  if (header.token != token || header.version != version || header.policy_id != policy_id ||
      header.total_bytes != bytes) {
    return absl::DataLossError(absl::StrCat(path, " holds version ", header.version, " (token ",
                                            header.token, ", policy_id ", header.policy_id,
                                            "), not version ", version, " (token ", token,
                                            ", policy_id ", policy_id, ")"));
  }
  if (header.manifest_bytes < 0 || header.data_offset < kHeaderBytes + header.manifest_bytes ||
      header.data_offset > bytes) {
    return absl::DataLossError(path + ": manifest outside the segment");
  }
  std::string manifest_bytes(static_cast<size_t>(header.manifest_bytes), '\0');
  KAPPA_RETURN_IF_ERROR(
      ReadAll(fd.get(), manifest_bytes.data(), header.manifest_bytes, kHeaderBytes));
  kappa::v1::WeightGroupManifest manifest;
  if (!manifest.ParseFromString(manifest_bytes) || manifest.version() != version ||
      manifest.policy_id() != policy_id || static_cast<int32_t>(manifest.dtype()) != header.dtype) {
    return absl::DataLossError(path + ": the manifest does not parse or match the header");
  }
  const absl::StatusOr<torch::ScalarType> dtype = services::ToTorchDType(manifest.dtype());
  if (!dtype.ok() || (*dtype != torch::kFloat32 && *dtype != torch::kBFloat16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": dtype ", kappa::v1::DType_Name(manifest.dtype()), " is not float32 or bfloat16"));
  }
  std::vector<int64_t> offsets = ShmOffsets(manifest, header.data_offset);
  if (offsets.back() != bytes) {
    return absl::DataLossError(absl::StrCat(path, ": the parameters need ", offsets.back(),
                                            " bytes, the segment has ", bytes));
  }
  return std::make_unique<OpenShmSegment>(fd.release(), path, std::move(manifest), *dtype,
                                          std::move(offsets));
}

std::optional<double> ProcessStartSeconds(int pid) {
  std::ifstream stat_file("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat_file, text)) return std::nullopt;
  // Fields after the command's closing parenthesis start at field 3 (the
  // state); starttime is field 22, in clock ticks after boot.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int index = 3; index < 22; ++index) fields >> field;
  unsigned long long ticks = 0;
  if (!(fields >> ticks)) return std::nullopt;
  std::ifstream proc_stat("/proc/stat");
  std::string key;
  long long boot = -1;
  while (proc_stat >> key) {
    if (key == "btime") {
      proc_stat >> boot;
      break;
    }
    std::getline(proc_stat, key);
  }
  const long hz = sysconf(_SC_CLK_TCK);
  if (boot < 0 || hz <= 0) return std::nullopt;
  return static_cast<double>(boot) + static_cast<double>(ticks) / static_cast<double>(hz);
}

namespace {

// Whether segment `name` in `dir_fd` outlived the learner that wrote it:
// its pid is not a live process, or it is one that started after the
// segment was last written (the pid was reused).
bool OwnerIsGone(int dir_fd, const std::string& name, int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  struct stat segment {};
  if (fstatat(dir_fd, name.c_str(), &segment, 0) != 0) return false;
  const std::optional<double> started = ProcessStartSeconds(pid);
  if (!started) return false;  // not ours to tell
  const double written = static_cast<double>(segment.st_mtim.tv_sec) +
                         static_cast<double>(segment.st_mtim.tv_nsec) * 1e-9;
  // Start times are whole clock ticks (10 ms): a process that started
  // within a tick after the write is given the benefit of the doubt.
  return *started > written + 0.02;
}

}  // namespace

int SweepDeadShmSegments(const std::string& dir) {
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return 0;
  int removed = 0;
  const size_t prefix = std::strlen(kShmPrefix);
  while (dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix, kShmPrefix) != 0) continue;
    const size_t dash = name.find('-', prefix);
    int pid = 0;
    if (dash == std::string::npos || !absl::SimpleAtoi(name.substr(prefix, dash - prefix), &pid) ||
        pid <= 0) {
      continue;
    }
    if (!OwnerIsGone(dirfd(listing), name, pid)) continue;  // alive (or not ours to tell)
    if (unlinkat(dirfd(listing), name.c_str(), 0) == 0) ++removed;
  }
  closedir(listing);
  return removed;
}

}  // namespace kappa::dist
