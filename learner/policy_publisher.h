// Holds the latest published policy weights and wakes WatchPolicy streams
// when a newer version appears. Snapshots are immutable once published, so
// streams send them without holding any lock.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kappa::learner {

struct PolicySnapshot {
  int64_t version = 0;
  std::string model_config_json;
  // Hugging Face names -> contiguous CPU float32 tensors (deep copies).
  std::vector<std::pair<std::string, torch::Tensor>> weights;
};

class PolicyPublisher {
 public:
  void Publish(std::shared_ptr<const PolicySnapshot> snapshot) ABSL_LOCKS_EXCLUDED(mu_);
  // The latest snapshot if its version > known_version; waits for one until
  // `deadline` or shutdown (then nullptr).
  std::shared_ptr<const PolicySnapshot> WaitNewer(int64_t known_version, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t version() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::CondVar published_;
  std::shared_ptr<const PolicySnapshot> latest_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kappa::learner
