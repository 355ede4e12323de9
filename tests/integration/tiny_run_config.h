// The run configuration the end-to-end tests start `kappa run` with: models
// of a few thousand parameters on one-digit sums, so SFT bootstrap and each
// step take milliseconds and a test spends its time on the processes.
#pragma once

#include <string>

namespace kappa::testing {

// `root` holds runs/ and cache/; `trainer` is the flow mapping of the
// trainer section (what each test varies), e.g.
// "{steps: 6, groups_per_step: 3, group_size: 4, eval_every: 3}".
inline std::string TinyRunConfig(const std::string& name, const std::string& root, int workers,
                                 const std::string& trainer) {
  return "name: " + name + "\nruns_dir: " + root + "/runs\ndata_dir: " + root +
         "/cache\nworkers: " + std::to_string(workers) + R"(
task: {kind: arithmetic, min_digits: 1, max_digits: 1, operators: "+", train_size: 60, heldout_size: 20}
teacher:
  shape: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2,
          num_key_value_heads: 1, max_position_embeddings: 12}
  bootstrap: {steps: 30, batch_size: 16}
student:
  shape: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2,
          num_key_value_heads: 1, max_position_embeddings: 12}
  bootstrap: {steps: 5, batch_size: 16}
learner: {buffer_groups: 8, max_staleness: 2}
rollout: {max_new_tokens: 4, max_outstanding: 2}
trainer: )" + trainer + "\n";
}

}  // namespace kappa::testing
