// Gradient clipping and fp16 loss scaling without host synchronisation: every decision (clip
// coefficient, skip on overflow, scale update) stays on the device as a tensor, so a training
// step never waits for the GPU; the host reads the norm only when it logs.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln::optim {

// Scales the gradients in place so that their global L2 norm is at most max_norm (as
// torch.nn.utils.clip_grad_norm_ with eps 1e-6). Returns the norm before clipping, a 0-d fp32
// tensor on the gradients' device. max_norm <= 0 only measures.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

// Dynamic loss scaling as torch.amp.GradScaler: multiply the loss by scale(), call unscale()
// after backward (divides the gradients, records overflow in found_inf()), let the optimizer
// skip the step on overflow, then update() grows or backs off the scale.
class GradScaler {
 public:
  GradScaler(const at::Device& device, double init_scale = 65536.0, double growth_factor = 2.0,
             double backoff_factor = 0.5, int64_t growth_interval = 2000);
  const at::Tensor& scale() const { return scale_; }          // [1] fp32
  const at::Tensor& found_inf() const { return found_inf_; }  // [1] fp32, 1 if the last grads overflowed
  void unscale(const std::vector<at::Tensor>& params);
  // The same on gradient tensors themselves (ZeRO-2's shard, which belongs to no parameter).
  void unscale_grads(std::vector<at::Tensor> grads);
  void update();
  at::Tensor& growth_tracker() { return growth_tracker_; }  // [1] int32, saved in checkpoints
  at::Tensor& mutable_scale() { return scale_; }

 private:
  at::Tensor scale_, growth_tracker_, found_inf_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
};

}  // namespace kiln::optim
