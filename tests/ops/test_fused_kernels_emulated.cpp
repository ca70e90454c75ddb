// kiln's fused CUDA kernels (kernels/{rmsnorm,rope,swiglu,cross_entropy}.cu) run on the CPU
// through the CUDA emulation (kernels/emulation.h), against autograd through the ATen reference
// composition. fp32 checks the kernels' indexing and math tightly; bf16 runs their 128-bit pack
// paths and is held to one-rounding tolerances. Sizes are chosen to hit both the packed and the
// scalar path (lengths that are and are not multiples of 8), several blocks and grid-stride tails.
#include <cmath>
#include <tuple>
#include <utility>

#include <torch/csrc/autograd/autograd.h>
#include <catch2/catch.hpp>

#include "kernels/emulated.h"
#include "kiln/ops/cuda_arch.h"
#include "support.h"

using kiln::test::max_abs_diff;
namespace kk = kiln::kernels;

namespace {

kk::DType dtype_of(at::ScalarType t) {
  return t == at::kBFloat16 ? kk::DType::kBFloat16 : t == at::kHalf ? kk::DType::kFloat16 : kk::DType::kFloat32;
}

double tolerance(at::ScalarType t) {
  return t == at::kFloat ? 2e-5 : 3e-2;
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

}  // namespace

TEST_CASE("RMSNorm kernels (emulated) match autograd through the composition", "[ops][emulated]") {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    // Register variants (1000: rows filled in part; 4096: exactly) and the generic kernels (1003).
    for (int64_t cols : {1000, 1003, 4096}) {
      for (bool residual : {false, true}) {
        CAPTURE(dtype, cols, residual);
        const int64_t rows = 5;
        const at::Tensor x = at::randn({rows, cols}).to(dtype), res = at::randn({rows, cols}).to(dtype);
        const at::Tensor w = (at::rand({cols}) + 0.5).to(dtype), dy = at::randn({rows, cols}).to(dtype);
        at::Tensor y = at::empty_like(x), h = at::empty_like(x), rstd = at::empty({rows}, at::kFloat);
        kk::RmsNormFwdParams f;
        f.x = x.data_ptr();
        f.residual = residual ? res.data_ptr() : nullptr;
        f.weight = w.data_ptr();
        f.y = y.data_ptr();
        f.h = residual ? h.data_ptr() : nullptr;
        f.rstd = rstd.data_ptr<float>();
        f.rows = rows;
        f.cols = cols;
        f.x_row_stride = cols;
        f.eps = 1e-5f;
        f.dtype = dtype_of(dtype);
        kk::emulated::launch_rmsnorm_fwd(f, nullptr);

        // Reference in fp32: h = T(x + residual), y = w * h / rms(h).
        const at::Tensor h_ref = residual ? (x.to(at::kFloat) + res.to(at::kFloat)).to(dtype) : x;
        const at::Tensor hf = h_ref.to(at::kFloat).requires_grad_(), wf = w.to(at::kFloat).requires_grad_();
        const at::Tensor rstd_ref = at::rsqrt(hf.pow(2).mean(-1, true) + 1e-5);
        const at::Tensor y_ref = hf * rstd_ref * wf;
        CHECK(max_abs_diff(y, y_ref) < tolerance(dtype));
        CHECK(max_abs_diff(rstd, rstd_ref.squeeze(-1)) < 1e-4);
        if (residual) CHECK(max_abs_diff(h, h_ref) == 0);

        const int blocks = 2;  // two blocks over five rows: grid-stride rows and partial dweight sums
        at::Tensor dx = at::empty_like(x), dw_partial = at::empty({blocks, cols}, at::kFloat);
        kk::RmsNormBwdParams b;
        b.x = h_ref.contiguous().data_ptr();
        b.weight = w.data_ptr();
        b.dy = dy.data_ptr();
        b.rstd = rstd.data_ptr<float>();
        b.dx = dx.data_ptr();
        b.dweight_partial = dw_partial.data_ptr<float>();
        b.rows = rows;
        b.cols = cols;
        b.blocks = blocks;
        b.dtype = dtype_of(dtype);
        kk::emulated::launch_rmsnorm_bwd(b, nullptr);
        const auto g = torch::autograd::grad({(y_ref * dy.to(at::kFloat)).sum()}, {hf, wf});
        CHECK(max_abs_diff(dx, g[0]) < tolerance(dtype) * 4);
        CHECK(max_abs_diff(dw_partial.sum(0), g[1]) < (dtype == at::kFloat ? 1e-4 : 5e-2));
      }
    }
  }
}

// q and k (GQA: fewer k heads) of one launch, strided views of the projections' [B, T, H, D]
// storage: rotated in place, and the transpose written out of place into a fresh tensor (the
// autograd Function's backward), by the 128-bit kernel (D 16, 64) and the scalar one (D 6, and
// D 16 forced) in 32- and 64-bit pair indices.
TEST_CASE("RoPE kernel (emulated) rotates q and k in one launch, in place, and its transpose", "[ops][emulated]") {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t d : {16, 64, 6}) {
      const int64_t b = 2, nq = 4, nk = 2, t = 7;
      const at::Tensor qbase = at::randn({b, t, nq, d}).to(dtype), kbase = at::randn({b, t, nk, d}).to(dtype);
      const at::Tensor ang = at::arange(t).to(at::kFloat).unsqueeze(1) * at::rand({d});
      const at::Tensor cos = ang.cos().to(dtype).unsqueeze(0).contiguous(),
                       sin = ang.sin().to(dtype).unsqueeze(0).contiguous();
      const at::Tensor cf = cos.to(at::kFloat).unsqueeze(1), sf = sin.to(at::kFloat).unsqueeze(1);
      for (const auto [backward, vectorized, limit] :
           {std::tuple{false, true, int64_t{1} << 30}, std::tuple{true, true, int64_t{1} << 30},
            std::tuple{false, false, int64_t{0}}, std::tuple{true, false, int64_t{1} << 30}}) {
        CAPTURE(dtype, d, backward, vectorized, limit);
        const at::Tensor q = qbase.clone().transpose(1, 2), k = kbase.clone().transpose(1, 2);  // strided
        // Backward writes fresh contiguous gradients, forward rotates in place.
        const at::Tensor dq = backward ? at::empty({b, nq, t, d}, q.options()) : q;
        const at::Tensor dk = backward ? at::empty({b, nk, t, d}, k.options()) : k;
        kk::RopeParams p;
        auto side = [](const at::Tensor& src, const at::Tensor& dst) {
          kk::RopeTensor r;
          r.src = src.data_ptr();
          r.dst = dst.data_ptr();
          r.heads = src.size(1);
          for (int i = 0; i < 3; ++i) {
            r.src_stride[i] = src.stride(i);
            r.dst_stride[i] = dst.stride(i);
          }
          return r;
        };
        p.q = side(q, dq);
        p.k = side(k, dk);
        p.narrow_index_limit = limit;
        p.vectorized = vectorized;
        p.cos = cos.data_ptr();
        p.sin = sin.data_ptr();
        p.batch = b;
        p.seq = t;
        p.dim = d;
        p.backward = backward;
        p.dtype = dtype_of(dtype);
        kk::emulated::launch_rope(p, nullptr);
        for (const auto& [got, base] : {std::pair{dq, qbase}, std::pair{dk, kbase}}) {
          const at::Tensor xf = base.transpose(1, 2).to(at::kFloat).requires_grad_();
          at::Tensor want;
          if (!backward) {
            want = xf * cf + rotate_half(xf) * sf;
          } else {  // the transpose of the rotation, applied to x as the incoming gradient
            const at::Tensor probe = at::randn_like(xf).requires_grad_();
            const at::Tensor y = probe * cf + rotate_half(probe) * sf;
            want = torch::autograd::grad({y}, {probe}, {xf.detach()})[0];
          }
          CHECK(max_abs_diff(got, want) < tolerance(dtype) * 2);
        }
        if (backward) {  // the sources are only read
          CHECK(at::equal(q, qbase.transpose(1, 2)));
          CHECK(at::equal(k, kbase.transpose(1, 2)));
        }
      }
    }
  }
}

// Autocast's mixed form (bf16/fp16 q or k, fp32 tables): the kernel gives the bits of autograd
// through the reference composition, forward (fp32 y) and backward (dx in x's dtype), per-sequence
// and shared tables, out of a strided view into a strided result.
TEST_CASE("RoPE mixed-dtype kernel (emulated) gives the reference's bits, forward and backward", "[ops][emulated]") {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t table_batch : {int64_t{2}, int64_t{1}}) {
      CAPTURE(dtype, table_batch);
      const int64_t b = 2, heads = 3, t = 7, d = 16;
      const at::Tensor x = at::randn({b, t, heads, d}).to(dtype).transpose(1, 2);  // [B, H, T, D] strided
      const at::Tensor dy = at::randn({b, heads, t, d});
      const at::Tensor ang = at::rand({table_batch, t, 1}) * 100 * at::rand({d});
      const at::Tensor cos = ang.cos().contiguous(), sin = ang.sin().contiguous();
      // The reference: ATen's promotion forward, autograd's casts backward.
      const at::Tensor leaf = x.detach().requires_grad_();
      const at::Tensor y_ref = leaf * cos.unsqueeze(1) + rotate_half(leaf) * sin.unsqueeze(1);
      REQUIRE(y_ref.scalar_type() == at::kFloat);
      const at::Tensor dx_ref = torch::autograd::grad({y_ref}, {leaf}, {dy})[0];
      REQUIRE(dx_ref.scalar_type() == dtype);

      at::Tensor y = at::empty({b, t, heads, d}).transpose(1, 2), dx = at::empty({b, heads, t, d}, x.options());
      kk::RopeMixedParams p;
      p.cos = cos.data_ptr<float>();
      p.sin = sin.data_ptr<float>();
      p.batch = b;
      p.heads = heads;
      p.seq = t;
      p.dim = d;
      p.table_batched = table_batch == b;
      p.dtype = dtype_of(dtype);
      // The 128-bit kernel (what these sizes take), then the scalar one with 32-bit pair indices
      // and the 64-bit path forced (limit 0).
      for (const auto [vectorized, limit] :
           {std::pair{true, int64_t{1} << 30}, std::pair{false, int64_t{1} << 30}, std::pair{false, int64_t{0}}}) {
        CAPTURE(vectorized, limit);
        p.vectorized = vectorized;
        p.narrow_index_limit = limit;
        y.zero_();
        dx.zero_();
        for (bool backward : {false, true}) {
          const at::Tensor& src = backward ? dy : x;
          at::Tensor& dst = backward ? dx : y;
          p.src = src.data_ptr();
          p.dst = dst.data_ptr();
          for (int k = 0; k < 3; ++k) {
            p.src_stride[k] = src.stride(k);
            p.dst_stride[k] = dst.stride(k);
          }
          p.backward = backward;
          kk::emulated::launch_rope_mixed(p, nullptr);
        }
        CHECK(at::equal(y, y_ref));
        CHECK(at::equal(dx, dx_ref));
      }
    }
  }
}

TEST_CASE("SwiGLU kernels (emulated) match autograd through silu(gate) * up", "[ops][emulated]") {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t n : {4096, 1001}) {
      CAPTURE(dtype, n);
      const at::Tensor g = at::randn({n}).to(dtype), u = at::randn({n}).to(dtype), dy = at::randn({n}).to(dtype);
      at::Tensor y = at::empty_like(g), dg = at::empty_like(g), du = at::empty_like(g);
      kk::SwiGluParams p;
      p.gate = g.data_ptr();
      p.up = u.data_ptr();
      p.dy = dy.data_ptr();
      p.y = y.data_ptr();
      p.d_gate = dg.data_ptr();
      p.d_up = du.data_ptr();
      p.n = n;
      p.dtype = dtype_of(dtype);
      kk::emulated::launch_swiglu_fwd(p, nullptr);
      kk::emulated::launch_swiglu_bwd(p, nullptr);
      const at::Tensor gf = g.to(at::kFloat).requires_grad_(), uf = u.to(at::kFloat).requires_grad_();
      const at::Tensor yf = at::silu(gf) * uf;
      const auto grads = torch::autograd::grad({yf}, {gf, uf}, {dy.to(at::kFloat)});
      CHECK(max_abs_diff(y, yf) < tolerance(dtype) * 2);
      CHECK(max_abs_diff(dg, grads[0]) < tolerance(dtype) * 2);
      CHECK(max_abs_diff(du, grads[1]) < tolerance(dtype) * 2);
    }
  }
}

TEST_CASE("cross-entropy kernel (emulated): loss, lse and the in-place gradient match autograd", "[ops][emulated]") {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t vocab : {1024, 1003}) {
      for (double z : {0.0, 1e-3}) {
        CAPTURE(dtype, vocab, z);
        const int64_t rows = 4;
        const at::Tensor logits = (at::randn({rows, vocab}) * 3).to(dtype);
        const at::Tensor labels = at::tensor({int64_t{5}, int64_t{-100}, vocab - 1, int64_t{0}});
        at::Tensor work = logits.clone(), loss = at::empty({rows}, at::kFloat), lse = at::empty({rows}, at::kFloat);
        kk::CrossEntropyParams p;
        p.logits = work.data_ptr();
        p.labels = labels.data_ptr<int64_t>();
        p.loss = loss.data_ptr<float>();
        p.lse = lse.data_ptr<float>();
        p.rows = rows;
        p.vocab = vocab;
        p.ignore_index = -100;
        p.z_loss = static_cast<float>(z);
        p.dtype = dtype_of(dtype);
        kk::emulated::launch_cross_entropy_fwd_bwd(p, nullptr);

        const at::Tensor x = logits.to(at::kFloat).requires_grad_();
        const at::Tensor lse_ref = at::logsumexp(x, -1);
        const at::Tensor valid = labels != -100;
        const at::Tensor target = x.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1);
        const at::Tensor loss_ref = at::where(valid, lse_ref - target + z * lse_ref * lse_ref, at::zeros_like(lse_ref));
        const at::Tensor grad_ref = torch::autograd::grad({loss_ref.sum()}, {x})[0];
        CHECK(max_abs_diff(lse, lse_ref) < 1e-4);
        CHECK(max_abs_diff(loss, loss_ref) < 1e-4);
        CHECK(max_abs_diff(work, grad_ref) < (dtype == at::kFloat ? 1e-6 : 1e-2));
      }
    }
  }
}

TEST_CASE("cross-entropy kernel (emulated): fp16 rounds the gradient after grad_scale", "[ops][emulated]") {
  // Rows whose non-target probabilities are about 1e-8, below half of fp16's smallest subnormal
  // (6e-8): (softmax - onehot) times GradScaler's 65536 / 12 targets is what must be rounded to
  // fp16. Reference: that product in fp64 from the same fp16 logits, rounded once to fp16. (ATen's
  // fp32 cross-entropy is no reference for the target here: it subtracts a rounded lse of 18.4,
  // whose 2e-6 step is 10-20% of 1 - p(target) = 1e-5.)
  at::manual_seed(21);
  for (int64_t vocab : {1024, 1003}) {  // the 128-bit packs and the scalar loop
    CAPTURE(vocab);
    const int64_t rows = 4;
    const at::Tensor labels = at::tensor({int64_t{5}, int64_t{-100}, vocab - 1, int64_t{0}});
    at::Tensor x = at::randn({rows, vocab}) * 0.3;
    x.index_put_({at::arange(rows), labels.clamp_min(0)}, 18.4);  // exp(-18.4) = 1e-8 per other class
    const at::Tensor logits = x.to(at::kHalf);
    float grad_scale = static_cast<float>(65536.0 / 12.0);
    at::Tensor work = logits.clone(), loss = at::empty({rows}, at::kFloat), lse = at::empty({rows}, at::kFloat);
    kk::CrossEntropyParams p;
    p.logits = work.data_ptr();
    p.labels = labels.data_ptr<int64_t>();
    p.loss = loss.data_ptr<float>();
    p.lse = lse.data_ptr<float>();
    p.rows = rows;
    p.vocab = vocab;
    p.grad_scale = &grad_scale;
    p.dtype = kk::DType::kFloat16;
    kk::emulated::launch_cross_entropy_fwd_bwd(p, nullptr);

    const at::Tensor x64 = logits.to(at::kDouble), valid = (labels != -100).unsqueeze(1);
    const at::Tensor onehot = at::one_hot(labels.clamp_min(0), vocab).to(at::kBool);
    const at::Tensor g64 = at::where(valid, at::softmax(x64, 1) - onehot.to(at::kDouble), at::zeros_like(x64));
    const at::Tensor want = (g64 * static_cast<double>(grad_scale)).to(at::kHalf).to(at::kDouble);
    const at::Tensor got = work.to(at::kDouble);
    const at::Tensor loss64 =
        at::where(valid.squeeze(1), -at::log_softmax(x64, 1).gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1),
                  at::zeros({rows}, at::kDouble));
    CHECK(at::allclose(loss.to(at::kDouble), loss64, 2e-2, 1e-7));  // 1e-5 per row, fp32's sum of exp
    const at::Tensor err = (got - want).abs();
    // Other classes: one fp16 rounding of fp32 arithmetic, 0.2% or, in the subnormal range, one
    // step of 6e-8. The target's 1 - p = 1e-5 carries fp32's error of the row's sum: 3%.
    CHECK((err <= want.abs() * 2e-3 + 6e-8).logical_or(onehot).all().item<bool>());
    CHECK((err <= want.abs() * 3e-2).logical_or(onehot.logical_not()).all().item<bool>());
    CHECK(got.ne(0).sum().item<int64_t>() == (rows - 1) * vocab);  // no entry of a valid row is 0
    // The case is the one described: unscaled, almost every non-target entry rounds to 0 in fp16.
    CHECK(g64.to(at::kHalf).eq(0).sum().item<int64_t>() > (rows - 1) * (vocab - 1) * 9 / 10);
  }
}

TEST_CASE("the kernels plan a V100's 96 KiB of shared memory per block below sm_80", "[ops][emulated]") {
  // sharedMemPerBlockOptin as the devices report it: V100 96 KiB, A100 163 KiB, H100/H200 227 KiB.
  CHECK(kiln::ops::planned_smem_optin(70, 98304) == 98304);
  CHECK(kiln::ops::planned_smem_optin(90, 232448) == 232448);
  CHECK(kiln::ops::planned_smem_optin(80, 166912) == 166912);
  // KILN_KERNEL_ARCH=70 on an H100 plans for the V100: flash attention's head-dim-128 blocks
  // (144 KiB) then do not fit and the op runs ATen's attention, as on a V100.
  CHECK(kiln::ops::planned_smem_optin(70, 232448) == 98304);
  CHECK(kiln::kernels::emulated::flash_smem_bytes(128, 70) >
        static_cast<size_t>(kiln::ops::planned_smem_optin(70, 232448)));
  // RMSNorm's backward: one fp32 accumulator per column, within the planned opt-in.
  CHECK(kiln::kernels::emulated::rmsnorm_bwd_smem_bytes(2048) <= kiln::ops::planned_smem_optin(70, 98304));
}
