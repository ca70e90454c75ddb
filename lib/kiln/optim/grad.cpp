#include "kiln/optim/grad.h"

#include <ATen/ATen.h>

namespace kiln::optim {

namespace {
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}
}  // namespace

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> grads = grads_of(params);
  if (grads.empty()) return at::zeros({}, at::kFloat);
  const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2, at::kFloat);
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
  if (max_norm > 0) {
    const at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    at::_foreach_mul_(grads, coef);
  }
  return total;
}

GradScaler::GradScaler(const at::Device& device, double init_scale, double growth_factor, double backoff_factor,
                       int64_t growth_interval)
    : scale_(at::full({1}, init_scale, at::TensorOptions().device(device).dtype(at::kFloat))),
      growth_tracker_(at::zeros({1}, at::TensorOptions().device(device).dtype(at::kInt))),
      found_inf_(at::zeros({1}, at::TensorOptions().device(device).dtype(at::kFloat))),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval) {}

void GradScaler::unscale(const std::vector<at::Tensor>& params) {
  unscale_grads(grads_of(params));
}

void GradScaler::unscale_grads(std::vector<at::Tensor> grads) {
  at::NoGradGuard no_grad;
  found_inf_.zero_();
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, scale_.reciprocal());
}

void GradScaler::update() {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, growth_factor_, backoff_factor_, growth_interval_);
}

}  // namespace kiln::optim
