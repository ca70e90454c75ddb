// Every kiln CUDA kernel on small shapes, in one test case: the program that
// scripts/device_check.sh runs under compute-sanitizer (memcheck, racecheck, synccheck, initcheck),
// on this GPU's code paths and on the Volta ones (KILN_KERNEL_ARCH=70). Small, so that racecheck's
// instrumentation of every shared-memory access stays within a step's limit; it also runs in the
// plain [cuda] runs (well under a second there).
//
// Kernels: rmsnorm forward and backward (with and without the fused residual add, packed and odd
// widths, strided rows), rope in place (same-dtype tables) and rope_mixed_kernel (bf16/fp16
// projections with fp32 tables, autocast's form), swiglu forward and backward, the loss head's
// cross-entropy kernel (chunked, ignored rows, z-loss), flash attention forward and backward with
// both dQ modes (atomic and deterministic), GQA, a partial last tile, causal and not, segment ids
// and the decode shape (fewer queries than keys).
//
// Each result is checked against the fp64 ATen reference on the CPU, computed from the same
// (rounded) inputs, within a tolerance per dtype: loose next to the [cuda] tests of each op (their
// rule is twice the error of ATen in the same dtype), but far below what a wrong element, a lost
// write or a NaN gives. The CPU side keeps the ATen kernels that run on the GPU few (copies,
// casts, the loss head's matmuls), so that the sanitizers' reports are about kiln's kernels.
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#ifdef KILN_WITH_CUDA
#include "kiln/ops/cuda_arch.h"
#endif
#include <catch2/catch.hpp>

#include "kiln/model/llama_config.h"
#include "kiln/model/rope.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/flash_attention.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/ops/rmsnorm.h"
#include "kiln/ops/rope.h"
#include "kiln/ops/swiglu.h"
#include "support.h"

namespace {

using kiln::ops::FlashAttentionParams;

// The largest error allowed, relative to the reference's largest magnitude: a few roundings to the
// dtype (bf16 keeps 8 bits, fp16 11), with room for the sums the kernels order differently.
double tolerance(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return 5e-2;
  if (dtype == at::kHalf) return 1.5e-2;
  return 1e-4;
}

// max |got - want| <= tol * max |want| (a NaN fails); got on any device and dtype, want fp64 on CPU.
bool close(const at::Tensor& got, const at::Tensor& want, double tol) {
  const at::Tensor g = got.detach().to(at::kCPU).to(at::kDouble), w = want.detach().to(at::kCPU).to(at::kDouble);
  if (g.sizes() != w.sizes()) return false;
  const double scale = w.abs().max().item<double>();
  const double err = (g - w).abs().max().item<double>();
  return err <= tol * std::max(scale, 1e-6);
}

// Fresh copies (never the input itself), so that each side's leaves are its own.
at::Tensor on_gpu(const at::Tensor& cpu, at::ScalarType dtype) {
  return cpu.to(at::TensorOptions().device(at::kCUDA).dtype(dtype), /*non_blocking=*/false, /*copy=*/true);
}
// The reference's input: the same rounded values, in fp64 on the CPU.
at::Tensor ref64(const at::Tensor& cpu, at::ScalarType dtype) {
  return cpu.to(dtype).to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
}

int kernel_arch() {
#ifdef KILN_WITH_CUDA
  return kiln::ops::kernel_target(at::Device(at::kCUDA, 0)).arch;
#else
  return 0;
#endif
}

void check_rmsnorm(at::ScalarType dtype, int64_t h) {
  const at::Tensor x = at::randn({5, h}), r = at::randn({5, h}), w = at::rand({h}) + 0.5;
  const at::Tensor gy = at::randn({5, h}), gh = at::randn({5, h});
  // rmsnorm: y and its gradients.
  {
    const at::Tensor xg = on_gpu(x, dtype).requires_grad_(), wg = on_gpu(w, dtype).requires_grad_();
    const at::Tensor y = kiln::ops::rmsnorm(xg, wg, 1e-5);
    y.backward(on_gpu(gy, dtype));
    const at::Tensor xr = ref64(x, dtype).requires_grad_(), wr = ref64(w, dtype).requires_grad_();
    const at::Tensor yr = kiln::ops::rmsnorm_reference(xr, wr, 1e-5);
    yr.backward(ref64(gy, dtype));
    CHECK(close(y, yr, tolerance(dtype)));
    CHECK(close(xg.grad(), xr.grad(), tolerance(dtype)));
    CHECK(close(wg.grad(), wr.grad(), tolerance(dtype)));
  }
  // add_rmsnorm: the fused residual add, both outputs with gradients.
  {
    const at::Tensor xg = on_gpu(x, dtype).requires_grad_(), rg = on_gpu(r, dtype).requires_grad_();
    const at::Tensor wg = on_gpu(w, dtype).requires_grad_();
    const auto [y, hsum] = kiln::ops::add_rmsnorm(xg, rg, wg, 1e-5);
    torch::autograd::backward({y, hsum}, {on_gpu(gy, dtype), on_gpu(gh, dtype)});
    const at::Tensor xr = ref64(x, dtype).requires_grad_(), rr = ref64(r, dtype).requires_grad_();
    const at::Tensor wr = ref64(w, dtype).requires_grad_();
    const at::Tensor hr = xr + rr;
    const at::Tensor yr = kiln::ops::rmsnorm_reference(hr, wr, 1e-5);
    torch::autograd::backward({yr, hr}, {ref64(gy, dtype), ref64(gh, dtype)});
    CHECK(close(y, yr, tolerance(dtype)));
    CHECK(close(hsum, hr, tolerance(dtype)));
    CHECK(close(xg.grad(), xr.grad(), tolerance(dtype)));
    CHECK(close(rg.grad(), rr.grad(), tolerance(dtype)));
    CHECK(close(wg.grad(), wr.grad(), tolerance(dtype)));
  }
  // Rows with a stride wider than the row (a narrowed buffer), forward only.
  {
    const at::Tensor wide = at::randn({5, 2 * h});
    const at::NoGradGuard no_grad;
    const at::Tensor y = kiln::ops::rmsnorm(on_gpu(wide, dtype).narrow(1, 0, h), on_gpu(w, dtype), 1e-5);
    const at::Tensor yr = kiln::ops::rmsnorm_reference(ref64(wide, dtype).narrow(1, 0, h), ref64(w, dtype), 1e-5);
    CHECK(close(y, yr, tolerance(dtype)));
  }
}

void check_swiglu(at::ScalarType dtype, int64_t n) {
  const at::Tensor g = at::randn({3, n}) * 3, u = at::randn({3, n}), dy = at::randn({3, n});
  const at::Tensor gg = on_gpu(g, dtype).requires_grad_(), ug = on_gpu(u, dtype).requires_grad_();
  const at::Tensor y = kiln::ops::swiglu(gg, ug);
  y.backward(on_gpu(dy, dtype));
  const at::Tensor gr = ref64(g, dtype).requires_grad_(), ur = ref64(u, dtype).requires_grad_();
  const at::Tensor yr = kiln::ops::swiglu_reference(gr, ur);
  yr.backward(ref64(dy, dtype));
  CHECK(close(y, yr, tolerance(dtype)));
  CHECK(close(gg.grad(), gr.grad(), tolerance(dtype)));
  CHECK(close(ug.grad(), ur.grad(), tolerance(dtype)));
}

// rope on x as the model makes it ([B, T, H, D] viewed as [B, H, T, D]); tables in table_dtype:
// the same dtype as x runs rope_kernel in place, fp32 tables under 16-bit x rope_mixed_kernel.
void check_rope(at::ScalarType dtype, at::ScalarType table_dtype, int64_t d) {
  kiln::model::LlamaConfig c = kiln::model::load_llama_config("tiny");
  c.head_dim = d;
  c.rope_scaling.rope_type = "llama3";
  const at::Tensor inv = kiln::model::rope_inv_freq(c);
  const at::Tensor pos = at::randint(1000, {2, 9}, at::kLong);
  const auto t_gpu = kiln::model::rope_cos_sin(inv.to(at::kCUDA), pos.to(at::kCUDA), table_dtype);
  const at::Tensor cos64 = t_gpu.cos.to(at::kCPU).to(at::kDouble), sin64 = t_gpu.sin.to(at::kCPU).to(at::kDouble);
  const at::Tensor x = at::randn({2, 9, 3, d}), dy = at::randn({2, 3, 9, d});
  const at::ScalarType out_dtype = table_dtype == at::kFloat ? at::kFloat : dtype;

  const at::Tensor leaf = on_gpu(x, dtype).requires_grad_();
  const at::Tensor y = kiln::ops::apply_rope_((leaf * 1).transpose(1, 2), t_gpu.cos, t_gpu.sin);
  REQUIRE(y.scalar_type() == out_dtype);
  y.backward(on_gpu(dy, out_dtype));
  const at::Tensor leaf_r = ref64(x, dtype).requires_grad_();
  const at::Tensor yr = kiln::ops::apply_rope_reference((leaf_r * 1).transpose(1, 2), cos64, sin64);
  yr.backward(ref64(dy, out_dtype));
  CHECK(close(y, yr, tolerance(dtype)));
  CHECK(close(leaf.grad(), leaf_r.grad(), tolerance(dtype)));
}

void check_linear_cross_entropy(at::ScalarType dtype, int64_t vocab) {
  const at::Tensor hidden = at::randn({37, 64}), weight = at::randn({vocab, 64}) * 0.05;
  at::Tensor labels = at::randint(vocab, {37}, at::kLong);
  labels.index_put_({at::arange(0, 37, 4)}, -100);                                      // every fourth row ignored
  const kiln::ops::LinearCrossEntropyOptions opts{.z_loss = 1e-4, .chunk_tokens = 16};  // a partial last chunk

  const at::Tensor hg = on_gpu(hidden, dtype).requires_grad_(), wg = on_gpu(weight, dtype).requires_grad_();
  const auto got = kiln::ops::linear_cross_entropy(hg, wg, labels.to(at::kCUDA), opts);
  got.loss.backward();
  const at::Tensor hr = ref64(hidden, dtype).requires_grad_(), wr = ref64(weight, dtype).requires_grad_();
  const auto want = kiln::ops::linear_cross_entropy_reference(hr, wr, labels, opts);
  want.loss.backward();
  CHECK(got.num_tokens.item<int64_t>() == want.num_tokens.item<int64_t>());
  CHECK(close(got.loss, want.loss, tolerance(dtype)));
  CHECK(close(hg.grad(), hr.grad(), tolerance(dtype)));
  CHECK(close(wg.grad(), wr.grad(), tolerance(dtype)));
}

// Forward and backward (dout = w) of the kernels, dQ by atomics and then by its own deterministic
// pass, against the blocked fp64 reference on the CPU.
void check_flash(at::ScalarType dtype, int64_t d, int64_t t, int64_t s, bool causal, bool segments) {
  const at::Tensor q = at::randn({2, 2, t, d}), k = at::randn({2, 1, s, d}), v = at::randn({2, 1, s, d});
  const at::Tensor w = at::randn({2, 2, t, d});
  at::Tensor seg;
  if (segments) seg = (at::rand({2, t}) < 0.05).to(at::kInt).cumsum(1).to(at::kInt);  // a few documents a row
  const FlashAttentionParams pr{.causal = causal, .segment_ids = seg};
  const at::Tensor q64 = ref64(q, dtype), k64 = ref64(k, dtype), v64 = ref64(v, dtype);
  const auto fwd_r = kiln::ops::flash_attention_forward(q64, k64, v64, pr);
  const auto grads_r = kiln::ops::flash_attention_backward(q64, k64, v64, fwd_r, ref64(w, dtype), pr);

  const at::Tensor qg = on_gpu(q, dtype), kg = on_gpu(k, dtype), vg = on_gpu(v, dtype), wg = on_gpu(w, dtype);
  for (bool deterministic : {false, true}) {
    CAPTURE(deterministic);
    const FlashAttentionParams p{
        .causal = causal, .segment_ids = segments ? seg.to(at::kCUDA) : at::Tensor(), .deterministic = deterministic};
    REQUIRE(kiln::ops::flash_attention_kernel_applies(qg, kg, vg, p));
    const auto fwd = kiln::ops::flash_attention_forward(qg, kg, vg, p);
    const auto grads = kiln::ops::flash_attention_backward(qg, kg, vg, fwd, wg, p);
    CHECK(close(fwd.out, fwd_r.out, tolerance(dtype)));
    CHECK(close(fwd.lse, fwd_r.lse, 1e-3));  // fp32 in the kernel
    CHECK(close(grads.dq, grads_r.dq, tolerance(dtype)));
    CHECK(close(grads.dk, grads_r.dk, tolerance(dtype)));
    CHECK(close(grads.dv, grads_r.dv, tolerance(dtype)));
  }
}

}  // namespace

TEST_CASE("every kiln CUDA kernel on small shapes (the compute-sanitizer program)", "[ops][cuda][sanitize]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  const kiln::ops::BackendScope kiln_kernels("kiln");  // attention's default is SDPA: every op's kernel here
  const int arch = kernel_arch();
  CAPTURE(arch);
  at::manual_seed(41);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    CAPTURE(dtype);
    for (int64_t h : {7, 256}) {  // odd (element loop) and packed (16-byte) rows
      CAPTURE(h);
      check_rmsnorm(dtype, h);
    }
    for (int64_t n : {7, 1000}) {
      CAPTURE(n);
      check_swiglu(dtype, n);
    }
    for (int64_t d : {64, 128}) {
      CAPTURE(d);
      check_rope(dtype, dtype, d);                                // rope_kernel, in place
      if (dtype != at::kFloat) check_rope(dtype, at::kFloat, d);  // rope_mixed_kernel
    }
    for (int64_t vocab : {97, 1000}) {
      CAPTURE(vocab);
      check_linear_cross_entropy(dtype, vocab);
    }
  }
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t d : {64, 128}) {
      CAPTURE(dtype, d);
      if (arch < 80 && (dtype == at::kBFloat16 || d == 128)) {
        // Volta paths: no bf16 tiles, and head dim 128's shared memory exceeds a V100's: ATen runs.
        const at::Tensor x = at::randn({1, 2, 80, d}, at::TensorOptions().device(at::kCUDA).dtype(dtype));
        CHECK_FALSE(kiln::ops::flash_attention_kernel_applies(x, x, x, {}));
        continue;
      }
      check_flash(dtype, d, 80, 80, /*causal=*/true, /*segments=*/false);
      check_flash(dtype, d, 80, 80, /*causal=*/false, /*segments=*/false);
      check_flash(dtype, d, 80, 80, /*causal=*/true, /*segments=*/true);
      check_flash(dtype, d, 5, 80, /*causal=*/true, /*segments=*/false);  // decode: 5 queries, 80 keys
    }
  }
}
