#include "kiln/ops/rope.h"

#include <ATen/ATen.h>

namespace kiln::ops {

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4, "apply_rope: x must be [B, H, T, D], got ", x.sizes());
  TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes(), "apply_rope: cos/sin must be [B, T, D], got ", cos.sizes(),
              " and ", sin.sizes());
  TORCH_CHECK(cos.size(1) == x.size(2) && cos.size(2) == x.size(3) && (cos.size(0) == x.size(0) || cos.size(0) == 1),
              "apply_rope: cos/sin ", cos.sizes(), " do not fit x ", x.sizes());
  const int64_t half = x.size(-1) / 2;
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // [B, 1, T, D] broadcast over heads
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * c + rotated * s;
}

}  // namespace kiln::ops
