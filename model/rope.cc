#include "model/rope.h"

#include <torch/torch.h>

#include <cmath>

namespace kappa::model {

torch::Tensor RopeInverseFrequencies(const ModelConfig& config) {
  const int64_t dim = config.head_dim();
  // _compute_default_rope_parameters: the exponent in float32, the power of a
  // Python float base.
  auto exponent = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<float>(dim);
  auto inv_freq = 1.0 / torch::pow(config.rope_theta, exponent);
  const RopeScaling& s = config.rope_scaling;
  switch (s.type) {
    case RopeScaling::Type::kNone:
      return inv_freq;
    case RopeScaling::Type::kLinear:  // _compute_linear_scaling_rope_parameters
      return inv_freq / s.factor;
    case RopeScaling::Type::kLlama3: {  // _compute_llama3_parameters
      const double old_context = static_cast<double>(s.original_max_position_embeddings);
      const double low_freq_wavelen = old_context / s.low_freq_factor;
      const double high_freq_wavelen = old_context / s.high_freq_factor;
      auto wavelen = 2 * M_PI / inv_freq;
      auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
      auto smooth = (old_context / wavelen - s.low_freq_factor) /
                    (s.high_freq_factor - s.low_freq_factor);
      auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
      auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
      return torch::where(medium, smoothed, scaled);
    }
  }
  return inv_freq;
}

std::pair<torch::Tensor, torch::Tensor> RopeTables(const ModelConfig& config) {
  auto inv_freq = RopeInverseFrequencies(config);
  // LlamaRotaryEmbedding.forward: positions times frequencies in float32.
  auto positions = torch::arange(config.max_position_embeddings, torch::kInt64).to(torch::kFloat32);
  auto freqs = torch::outer(positions, inv_freq);
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

}  // namespace kappa::model
