#include "verifier/sandbox_cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace kappa::verifier::sandbox_internal {
namespace {

constexpr char kCgroupRoot[] = "/sys/fs/cgroup";
constexpr char kVerifierLeaf[] = "kappa-verifier";

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  const ssize_t n = write(fd, text.data(), text.size());
  const int error = errno;
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::ErrnoToStatus(error, absl::StrCat("writing '", text, "' to ", path));
  }
  return absl::OkStatus();
}

bool IsFilesystem(const std::string& path, int64_t magic) {
  struct statfs fs {};
  return statfs(path.c_str(), &fs) == 0 && static_cast<int64_t>(fs.f_type) == magic;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// This process's cgroup path in the hierarchy of `controller` ("" : the v2
// one), from /proc/self/cgroup; "/" when not found.
std::string OwnCgroup(const std::string& controller) {
  for (absl::string_view line : absl::StrSplit(ReadText("/proc/self/cgroup"), '\n')) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const bool match =
        controller.empty()
            ? fields[0] == "0" && fields[1].empty()
            : absl::c_linear_search(std::vector<absl::string_view>(absl::StrSplit(fields[1], ',')),
                                    controller);
    if (match) return std::string(fields[2]);
  }
  return "/";
}

// The directory of this process's cgroup under `mount`, or `mount` itself
// when the path does not exist there (a container's cgroup namespace).
std::string OwnCgroupDir(const std::string& mount, const std::string& controller) {
  const std::string path = OwnCgroup(controller);
  const std::string dir = path == "/" ? mount : mount + path;
  return IsDirectory(dir) ? dir : mount;
}

bool HasWord(const std::string& text, absl::string_view word) {
  for (absl::string_view token : absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (token == word) return true;
  }
  return false;
}

std::string Parent(const std::string& dir) { return dir.substr(0, dir.rfind('/')); }
std::string Base(const std::string& dir) { return dir.substr(dir.rfind('/') + 1); }

// A child of `parent` can be made and given `limit_file` = `value`.
absl::Status TryChild(const std::string& parent, const std::string& limit_file,
                      const std::string& value) {
  const std::string child = absl::StrCat(parent, "/kappa-probe-", getpid());
  if (mkdir(child.c_str(), 0755) < 0 && errno != EEXIST) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mkdir ", child));
  }
  absl::Status status = WriteText(absl::StrCat(child, "/", limit_file), value);
  rmdir(child.c_str());
  return status;
}

// v2: the parent of run cgroups is the verifier's own cgroup (or, once the
// verifier moved into its leaf, that leaf's parent), with memory and pids
// delegated to its children.
SandboxCgroups ProbeV2() {
  SandboxCgroups cgroups;
  const std::string own = OwnCgroupDir(kCgroupRoot, "");
  std::string parent = Base(own) == kVerifierLeaf ? Parent(own) : own;
  const std::string available = ReadText(parent + "/cgroup.controllers");
  if (!HasWord(available, "memory") || !HasWord(available, "pids")) {
    cgroups.missing =
        absl::StrCat("cgroup v2: the memory and pids controllers are not available in ", parent,
                     " (cgroup.controllers: '", available, "')");
    return cgroups;
  }
  const std::string subtree = parent + "/cgroup.subtree_control";
  auto delegated = [&] {
    const std::string enabled = ReadText(subtree);
    return HasWord(enabled, "memory") && HasWord(enabled, "pids");
  };
  if (!delegated() && !WriteText(subtree, "+memory +pids").ok() && own == parent) {
    // Processes in `parent` forbid delegation: move this one into a leaf.
    const std::string leaf = absl::StrCat(parent, "/", kVerifierLeaf);
    if (mkdir(leaf.c_str(), 0755) == 0 || errno == EEXIST) {
      if (WriteText(leaf + "/cgroup.procs", "0").ok()) {
        if (absl::Status status = WriteText(subtree, "+memory +pids"); !status.ok()) {
          WriteText(parent + "/cgroup.procs", "0").IgnoreError();  // back where it was
          rmdir(leaf.c_str());
        }
      }
    }
  }
  if (!delegated()) {
    cgroups.missing =
        absl::StrCat("cgroup v2: cannot delegate memory and pids in ", parent,
                     " (other processes share the verifier's cgroup, or it is read-only)");
    return cgroups;
  }
  if (absl::Status status = TryChild(parent, "memory.max", "max"); !status.ok()) {
    cgroups.missing = absl::StrCat("cgroup v2: ", status.message());
    return cgroups;
  }
  cgroups.version = 2;
  cgroups.memory = cgroups.pids = parent;
  return cgroups;
}

// v1: the verifier's cgroup in the memory hierarchy (and in pids if mounted).
SandboxCgroups ProbeV1() {
  SandboxCgroups cgroups;
  const std::string memory_mount = absl::StrCat(kCgroupRoot, "/memory");
  if (!IsFilesystem(memory_mount, CGROUP_SUPER_MAGIC)) {
    cgroups.missing =
        absl::StrCat(kCgroupRoot, " is not cgroup2 and has no cgroup v1 memory hierarchy");
    return cgroups;
  }
  const std::string memory = OwnCgroupDir(memory_mount, "memory");
  if (absl::Status status = TryChild(memory, "memory.limit_in_bytes", "1073741824"); !status.ok()) {
    cgroups.missing = absl::StrCat("cgroup v1: ", status.message());
    return cgroups;
  }
  cgroups.version = 1;
  cgroups.memory = memory;
  const std::string pids_mount = absl::StrCat(kCgroupRoot, "/pids");
  if (IsFilesystem(pids_mount, CGROUP_SUPER_MAGIC)) {
    const std::string pids = OwnCgroupDir(pids_mount, "pids");
    if (TryChild(pids, "pids.max", "32").ok()) cgroups.pids = pids;
  }
  return cgroups;
}

SandboxCgroups Probe() {
  if (geteuid() != 0) {
    SandboxCgroups none;
    none.missing = "not root";
    return none;
  }
  return IsFilesystem(kCgroupRoot, CGROUP2_SUPER_MAGIC) ? ProbeV2() : ProbeV1();
}

// Kills what is left in `dir` and removes it; waits up to 2 s for the
// processes to go.
void EmptyAndRemove(const std::string& dir, int version) {
  if (version == 2) WriteText(dir + "/cgroup.kill", "1").IgnoreError();
  const absl::Time give_up = absl::Now() + absl::Seconds(2);
  while (rmdir(dir.c_str()) < 0 && errno == EBUSY && absl::Now() < give_up) {
    for (absl::string_view line :
         absl::StrSplit(ReadText(dir + "/cgroup.procs"), '\n', absl::SkipEmpty())) {
      int pid = 0;
      if (absl::SimpleAtoi(line, &pid) && pid > 0) kill(pid, SIGKILL);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string NextRunName() {
  static std::atomic<uint64_t> next{0};
  return absl::StrCat("kappa-run-", getpid(), "-", next++);
}

}  // namespace

SandboxCgroups ProbeRunCgroups() {
  static const SandboxCgroups cgroups = Probe();
  return cgroups;
}

absl::Status RunCgroup::Create(const SandboxCgroups& parents, int64_t memory_bytes,
                               int max_processes) {
  version_ = parents.version;
  const std::string name = NextRunName();
  const std::string bytes = std::to_string(memory_bytes);
  const std::string processes = std::to_string(max_processes);
  auto make = [&](const std::string& parent, std::string* dir) {
    const std::string path = absl::StrCat(parent, "/", name);
    if (mkdir(path.c_str(), 0755) < 0) return absl::ErrnoToStatus(errno, "mkdir " + path);
    *dir = path;
    return absl::OkStatus();
  };
  if (absl::Status status = make(parents.memory, &memory_); !status.ok()) return status;
  if (version_ == 2) {
    if (absl::Status status = WriteText(memory_ + "/memory.max", bytes); !status.ok())
      return status;
    if (absl::Status status = WriteText(memory_ + "/pids.max", processes); !status.ok()) {
      return status;
    }
    // Best effort: swap accounting may be off; oom.group needs Linux 4.19.
    WriteText(memory_ + "/memory.swap.max", "0").IgnoreError();
    WriteText(memory_ + "/memory.oom.group", "1").IgnoreError();
  } else {
    if (absl::Status status = WriteText(memory_ + "/memory.limit_in_bytes", bytes); !status.ok()) {
      return status;
    }
    WriteText(memory_ + "/memory.memsw.limit_in_bytes", bytes).IgnoreError();  // swap accounting
    if (!parents.pids.empty()) {
      if (absl::Status status = make(parents.pids, &pids_); !status.ok()) return status;
      if (absl::Status status = WriteText(pids_ + "/pids.max", processes); !status.ok()) {
        return status;
      }
    }
  }
  memory_procs_ = open((memory_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (memory_procs_ < 0) return absl::ErrnoToStatus(errno, "open " + memory_ + "/cgroup.procs");
  if (!pids_.empty()) {
    pids_procs_ = open((pids_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (pids_procs_ < 0) return absl::ErrnoToStatus(errno, "open " + pids_ + "/cgroup.procs");
  }
  return absl::OkStatus();
}

bool RunCgroup::OomKilled() const {
  if (memory_.empty()) return false;
  const std::string events =
      ReadText(memory_ + (version_ == 2 ? "/memory.events" : "/memory.oom_control"));
  for (absl::string_view line : absl::StrSplit(events, '\n')) {
    int64_t count = 0;
    if (absl::ConsumePrefix(&line, "oom_kill ") && absl::SimpleAtoi(line, &count) && count > 0) {
      return true;
    }
  }
  return false;
}

RunCgroup::~RunCgroup() {
  for (const int fd : {memory_procs_, pids_procs_}) {
    if (fd >= 0) close(fd);
  }
  if (!memory_.empty()) EmptyAndRemove(memory_, version_);
  if (!pids_.empty()) EmptyAndRemove(pids_, version_);
}

}  // namespace kappa::verifier::sandbox_internal
