// configs/demo.yaml's model shape (its student and teacher are the same),
// for the benchmarks that time the demo's own model. Keep in step with the
// YAML: the harnesses are libtorch-only and do not read it.
#pragma once

#include "model/model_config.h"

namespace kappa::bench {

inline model::ModelConfig DemoShape() {
  model::ModelConfig c;
  c.vocab_size = 51;  // the demo's character tokenizer
  c.hidden_size = 128;
  c.intermediate_size = 352;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  return c;
}

}  // namespace kappa::bench
