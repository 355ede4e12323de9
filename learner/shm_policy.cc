#include "learner/shm_policy.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"

namespace kappa::learner {
namespace {

std::string KeyOrEmpty(const std::string& dir) {
  absl::StatusOr<std::string> key = dist::ShmHostKey(dir);
  if (!key.ok()) {
    spdlog::warn("shared-memory weight sync off: {}", key.status().ToString());
    return "";
  }
  return *std::move(key);
}

uint64_t Nonce() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

const char* DtypeName(torch::ScalarType dtype) {
  return dtype == torch::kBFloat16 ? "bf16" : dtype == torch::kFloat32 ? "f32" : "other";
}

}  // namespace

ShmPolicyStore::ShmPolicyStore(std::string dir)
    : dir_(std::move(dir)), host_key_(KeyOrEmpty(dir_)), nonce_(Nonce()) {
  if (host_key_.empty()) return;
  if (const int swept = dist::SweepDeadShmSegments(dir_); swept > 0) {
    spdlog::info("unlinked {} shared-memory policy segments of dead learners in {}", swept, dir_);
  }
}

ShmPolicyStore::~ShmPolicyStore() { UnlinkAll(); }

absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> ShmPolicyStore::Write(
    const dist::ShmContent& content) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_ || host_key_.empty()) {
      return absl::FailedPreconditionError("shared-memory policy segments are closed");
    }
    if (content.version <= newest_ - 2) {
      return absl::NotFoundError(absl::StrCat("version ", content.version, " is two behind ",
                                              newest_, ": no segment is kept for it"));
    }
  }
  const std::string name = absl::StrCat(dist::kShmPrefix, getpid(), "-", absl::Hex(nonce_), "-v",
                                        content.version, "-", DtypeName(content.dtype));
  int spare = -1;
  {
    absl::MutexLock lock(&mu_);
    std::swap(spare, spare_fd_);  // dist::WriteShmSegment uses it only if the size matches
  }
  absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> segment =
      dist::WriteShmSegment(dir_, name, content, spare);
  if (!segment.ok()) return segment.status();
  std::vector<std::string> stale;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      stale.push_back((*segment)->path());  // shut down while writing
    } else {
      linked_[{content.version, static_cast<int>(content.dtype)}] = (*segment)->path();
      newest_ = std::max(newest_, content.version);
      ++written_;
      PrepareSpare((*segment)->bytes());
      for (auto it = linked_.begin(); it != linked_.end() && it->first.first <= newest_ - 2;) {
        stale.push_back(it->second);
        it = linked_.erase(it);
      }
    }
  }
  for (const std::string& path : stale) unlink(path.c_str());
  return segment;
}

void ShmPolicyStore::PrepareSpare(int64_t bytes) {
  if (spare_fd_ >= 0 || preparing_) return;
  if (preparer_.joinable()) preparer_.join();  // finished: preparing_ is false
  preparing_ = true;
  preparer_ = std::thread([this, bytes] {
    absl::StatusOr<int> fd = dist::PrepareShmFile(dir_, bytes);
    absl::MutexLock lock(&mu_);
    preparing_ = false;
    if (!fd.ok()) return;  // no room for a spare: segments are written without one
    if (closed_ || spare_fd_ >= 0) {
      close(*fd);
    } else {
      spare_fd_ = *fd;
    }
  });
}

void ShmPolicyStore::UnlinkAll() {
  std::map<std::pair<int64_t, int>, std::string> linked;
  std::thread preparer;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    linked.swap(linked_);
    preparer.swap(preparer_);
    if (spare_fd_ >= 0) close(spare_fd_);
    spare_fd_ = -1;
  }
  for (const auto& [key, path] : linked) unlink(path.c_str());
  if (preparer.joinable()) preparer.join();
}

std::vector<std::string> ShmPolicyStore::linked() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> paths;
  for (const auto& [key, path] : linked_) paths.push_back(path);
  return paths;
}

int64_t ShmPolicyStore::segments_written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

}  // namespace kappa::learner
