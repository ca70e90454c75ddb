#include "kiln/model/rope.h"

#include <cmath>

#include <ATen/ATen.h>

namespace kiln::model {

at::Tensor rope_inv_freq(const LlamaConfig& config) {
  const int64_t dim = config.resolved_head_dim();
  const at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  at::Tensor inv_freq = 1.0 / at::pow(config.rope_theta, exponents);
  const RopeScaling& s = config.rope_scaling;
  if (s.rope_type != "llama3") return inv_freq;

  // Llama 3 scaling: long wavelengths (> old_len / low_freq_factor) are slowed by `factor`,
  // short ones (< old_len / high_freq_factor) kept, and the band between blended linearly in
  // old_len / wavelength.
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / s.low_freq_factor;
  const double high_freq_wavelen = old_len / s.high_freq_factor;
  const at::Tensor wavelen = 2.0 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

RopeTables rope_cos_sin(const at::Tensor& inv_freq, const at::Tensor& position_ids, at::ScalarType dtype) {
  TORCH_CHECK(position_ids.dim() == 2, "rope_cos_sin: position_ids must be [B, T], got ", position_ids.sizes());
  const at::Tensor freqs =
      position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq.to(position_ids.device()).view({1, 1, -1});
  const at::Tensor angles = at::cat({freqs, freqs}, -1);  // [B, T, D]
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

}  // namespace kiln::model
