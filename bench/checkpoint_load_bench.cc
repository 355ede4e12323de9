// Loading a real-size Hugging Face checkpoint: kappa_bench_checkpoint_load
// MODEL_DIR [--dtype float32|bfloat16] [--device cpu|cuda] [--tokens N] [--threads N]
//
// Prints one JSON line: the bytes of the weight files, the time to read them
// once (as `cat FILE > /dev/null` does: the page-cache baseline, measured in
// the same run first so both see a warm cache), LoadCheckpoint's wall time,
// the ratio of the two, the resident memory after the load and at its peak
// (getrusage; the process holds nothing else), and the time of one forward of
// a `tokens`-long sequence. The model is random (make_checkpoints.py --shape),
// so only sizes and times mean anything.
#include <fcntl.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Resident set size now (from /proc/self/statm) and the peak so far, in MiB.
double CurrentRssMiB() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr || std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
  if (f != nullptr) std::fclose(f);
  return static_cast<double>(pages_resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}
// One "Rss...:  N kB" line of /proc/self/status (RssAnon, RssFile), in MiB.
double StatusMiB(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  double kib = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, std::strlen(key)) == 0) kib = std::atof(line + std::strlen(key));
  }
  std::fclose(f);
  return kib / 1024.0;
}
double PeakRssMiB() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// Reads every weight file once, like cat > /dev/null; returns the bytes read.
uint64_t ReadThrough(const std::vector<fs::path>& files) {
  std::vector<char> buffer(1 << 20);
  uint64_t total = 0;
  for (const auto& path : files) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n;
    while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) total += static_cast<uint64_t>(n);
    ::close(fd);
  }
  return total;
}

std::vector<fs::path> WeightFiles(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s MODEL_DIR [--dtype float32|bfloat16] [--device cpu|cuda] [--tokens N] "
                 "[--threads N]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  torch::ScalarType dtype = torch::kFloat32;
  int64_t tokens = 512;
  torch::Device device = torch::kCPU;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dtype") dtype = value == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
    if (flag == "--tokens") tokens = std::atoll(value.c_str());
    if (flag == "--device") device = torch::Device(value);
    if (flag == "--threads") torch::set_num_threads(std::atoi(value.c_str()));
  }
  const double rss_start = CurrentRssMiB();
  const auto files = WeightFiles(dir);
  auto t0 = Clock::now();
  const uint64_t bytes = ReadThrough(files);
  const double read_s = Seconds(t0);

  t0 = Clock::now();
  kappa::model::Decoder model = kappa::model::LoadCheckpoint(dir, {device, dtype});
  const double load_s = Seconds(t0);
  const double rss_loaded = CurrentRssMiB();
  const double rss_peak = PeakRssMiB();
  const double anon_loaded = StatusMiB("RssAnon:");
  const double file_loaded = StatusMiB("RssFile:");
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();

  torch::NoGradGuard no_grad;
  model->eval();
  torch::manual_seed(0);
  auto ids = torch::randint(0, model->config().vocab_size, {1, tokens}, torch::kInt64);
  t0 = Clock::now();
  auto logits = model->Forward(ids).logits;
  const bool finite = torch::isfinite(logits).all().item<bool>();  // waits for the device
  const double forward_s = Seconds(t0);

  std::printf(
      "{\"dir\": \"%s\", \"weight_bytes\": %llu, \"parameters\": %lld, \"dtype\": \"%s\", "
      "\"read_through_s\": %.3f, \"load_s\": %.3f, \"load_over_read\": %.2f, "
      "\"rss_start_mib\": %.0f, \"rss_after_load_mib\": %.0f, \"rss_anon_mib\": %.0f, \"rss_file_mib\": %.0f, "
      "\"rss_peak_during_load_mib\": %.0f, "
      "\"parameter_mib\": %.0f, \"device\": \"%s\", \"forward_tokens\": %lld, \"forward_s\": %.3f, "
      "\"threads\": %d, "
      "\"logits_finite\": %s}\n",
      dir.c_str(), static_cast<unsigned long long>(bytes), static_cast<long long>(params),
      c10::toString(dtype), read_s, load_s, load_s / read_s, rss_start, rss_loaded, anon_loaded,
      file_loaded, rss_peak,
      static_cast<double>(params) * static_cast<double>(c10::elementSize(dtype)) / (1 << 20),
      device.str().c_str(), static_cast<long long>(tokens), forward_s, torch::get_num_threads(),
      finite ? "true" : "false");
  return 0;
}
