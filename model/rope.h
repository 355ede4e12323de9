// Rotary position embedding frequencies, as Hugging Face computes them
// (transformers/modeling_rope_utils.py): in float32, with the config's
// rope_scaling applied.
#pragma once

#include <torch/types.h>

#include "model/model_config.h"

namespace kappa::model {

// inv_freq[i] = 1 / theta^(2i / head_dim), i < head_dim / 2, then scaled:
//   linear: inv_freq / factor;
//   llama3: wavelengths longer than original_max / low_freq_factor are divided
//           by factor, shorter than original_max / high_freq_factor kept, and
//           the band between interpolated smoothly.
// [head_dim / 2] float32 on the CPU.
torch::Tensor RopeInverseFrequencies(const ModelConfig& config);

// cos and sin tables [max_position_embeddings, head_dim] (float32, halves
// repeated: HF's rotate_half layout) for positions 0..max-1.
std::pair<torch::Tensor, torch::Tensor> RopeTables(const ModelConfig& config);

}  // namespace kappa::model
