// Finite-difference gradient check in fp64 (the C++ counterpart of torch.autograd.gradcheck):
// every element of every input is perturbed by +-eps and the central difference of a scalar
// function is compared with the analytic gradient autograd returns.
#pragma once

#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

namespace kiln::test {

// fn maps the inputs (fp64, requires_grad) to a 0-d tensor. Returns the largest absolute
// difference between analytic and numerical gradients over all inputs.
inline double gradcheck_max_error(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                                  std::vector<at::Tensor> inputs, double eps = 1e-6) {
  for (auto& t : inputs) t = t.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor out = fn(inputs);
  const std::vector<at::Tensor> analytic = torch::autograd::grad({out}, inputs, {}, /*retain_graph=*/false,
                                                                 /*create_graph=*/false, /*allow_unused=*/true);
  double worst = 0;
  const at::NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor flat = inputs[i].view({-1});
    const at::Tensor a = analytic[i].defined() ? analytic[i].reshape({-1}) : at::zeros_like(flat);
    for (int64_t j = 0; j < flat.numel(); ++j) {
      const double v = flat[j].item<double>();
      flat[j].fill_(v + eps);
      const double up = fn(inputs).item<double>();
      flat[j].fill_(v - eps);
      const double down = fn(inputs).item<double>();
      flat[j].fill_(v);
      worst = std::max(worst, std::abs((up - down) / (2 * eps) - a[j].item<double>()));
    }
  }
  return worst;
}

}  // namespace kiln::test
