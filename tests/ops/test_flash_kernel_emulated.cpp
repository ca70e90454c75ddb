// kiln's CUDA flash-attention kernels (kernels/flash_attention.cu), run on the CPU through the
// CUDA emulation (kernels/emulation.h: every thread a fiber, WMMA tiles in fp32), against the
// fp32 ATen reference. Tolerance rule of docs/kernels.md: the kernel's error may be at most twice
// that of PyTorch's own attention (SDPA, autograd for gradients) in the same 16-bit dtype, plus a
// small absolute slack. Shapes cover one and several tiles, lengths that are not tile multiples,
// GQA, causal and non-causal, more keys than queries, segment masks and both dQ modes.
#include <torch/csrc/autograd/autograd.h>
#include <catch2/catch.hpp>

#include "kernels/emulated.h"
#include "kiln/ops/attention.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/flash_attention.h"
#include "support.h"

using kiln::test::max_abs_diff;
namespace kk = kiln::kernels;

namespace {

struct Case {
  at::ScalarType dtype;
  int64_t d, hq, hkv, t, s;
  bool causal;
  bool segments = false;
  bool deterministic = false;
  int arch = 80;  // 80: the cp.async kernels; 70: the Volta kernels (fp16, plain loads)
};

template <typename P>
P shape_of(const Case& c, const at::Tensor& seg) {
  P p;
  p.batch = 2;
  p.heads_q = static_cast<int>(c.hq);
  p.heads_kv = static_cast<int>(c.hkv);
  p.seq_q = static_cast<int>(c.t);
  p.seq_k = static_cast<int>(c.s);
  p.head_dim = static_cast<int>(c.d);
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  p.causal = c.causal;
  p.segment_ids = seg.defined() ? seg.data_ptr<int>() : nullptr;
  p.dtype = c.dtype == at::kBFloat16 ? kk::DType::kBFloat16 : kk::DType::kFloat16;
  p.arch = c.arch;
  return p;
}

struct Inputs {
  at::Tensor q, k, v, dout, seg;  // 16-bit, contiguous, CPU; seg int32 or undefined
};

Inputs make_inputs(const Case& c) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  Inputs in;
  in.q = at::randn({2, c.hq, c.t, c.d}, f32).to(c.dtype);
  in.k = at::randn({2, c.hkv, c.s, c.d}, f32).to(c.dtype);
  in.v = at::randn({2, c.hkv, c.s, c.d}, f32).to(c.dtype);
  in.dout = at::randn({2, c.hq, c.t, c.d}, f32).to(c.dtype);
  if (c.segments) in.seg = (at::rand({2, c.t}) < 0.05).to(at::kInt).cumsum(1).to(at::kInt).contiguous();
  return in;
}

// PyTorch's attention in the 16-bit dtype (the error budget) and in fp32 (the reference):
// output and gradients of sum(out * dout).
std::vector<at::Tensor> torch_attention(const Inputs& in, const Case& c, at::ScalarType dtype) {
  kiln::ops::set_backend(kiln::ops::Backend::kAten);
  const at::Tensor q = in.q.to(dtype).requires_grad_(), k = in.k.to(dtype).requires_grad_(),
                   v = in.v.to(dtype).requires_grad_();
  const at::Tensor out = kiln::ops::attention(q, k, v, {.causal = c.causal, .segment_ids = in.seg});
  const auto g = torch::autograd::grad({(out * in.dout.to(dtype)).sum()}, {q, k, v});
  kiln::ops::set_backend(kiln::ops::Backend::kKiln);
  return {out.detach(), g[0], g[1], g[2]};
}

void check_case(const Case& c) {
  const Inputs in = make_inputs(c);
  CAPTURE(c.dtype, c.d, c.hq, c.hkv, c.t, c.s, c.causal, c.segments, c.deterministic, c.arch);
  REQUIRE(kk::emulated::flash_supported(shape_of<kk::FlashShape>(c, in.seg)));

  // Packed documents: the launchers' tile-skipping workspace, as the op allocates it.
  const at::Tensor ranges =
      in.seg.defined() ? at::empty({static_cast<int64_t>(kk::emulated::flash_doc_ranges_ints(2, c.s))}, at::kInt)
                       : at::Tensor();
  auto fp = shape_of<kk::FlashFwdParams>(c, in.seg);
  fp.doc_ranges = ranges.defined() ? ranges.data_ptr<int>() : nullptr;
  const at::Tensor out = at::empty_like(in.q);
  const at::Tensor lse = at::empty({2, c.hq, c.t}, at::kFloat);
  fp.q = in.q.data_ptr();
  fp.k = in.k.data_ptr();
  fp.v = in.v.data_ptr();
  fp.out = out.data_ptr();
  fp.lse = lse.data_ptr<float>();
  kk::emulated::launch_flash_fwd(fp, nullptr);

  auto bp = shape_of<kk::FlashBwdParams>(c, in.seg);
  bp.doc_ranges = fp.doc_ranges;
  const at::Tensor delta = at::empty({2, c.hq, c.t}, at::kFloat);
  const at::Tensor dq_accum = at::zeros({2, c.hq, c.t, c.d}, at::kFloat);
  const at::Tensor dq = at::empty_like(in.q), dk = at::empty_like(in.k), dv = at::empty_like(in.v);
  bp.q = in.q.data_ptr();
  bp.k = in.k.data_ptr();
  bp.v = in.v.data_ptr();
  bp.out = out.data_ptr();
  bp.dout = in.dout.data_ptr();
  bp.lse = lse.data_ptr<float>();
  bp.delta = delta.data_ptr<float>();
  bp.dq_accum = dq_accum.data_ptr<float>();
  bp.dq = dq.data_ptr();
  bp.dk = dk.data_ptr();
  bp.dv = dv.data_ptr();
  bp.deterministic = c.deterministic;
  kk::emulated::launch_flash_bwd(bp, nullptr);

  const auto ref = torch_attention(in, c, at::kFloat);
  const auto same = torch_attention(in, c, c.dtype);
  const at::Tensor got[4] = {out, dq, dk, dv};
  const char* names[4] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    const double err = max_abs_diff(got[i], ref[i]), budget = 2 * max_abs_diff(same[i], ref[i]) + 2e-3;
    CAPTURE(names[i], err, budget);
    CHECK(err <= budget);
  }
  // The log-sum-exp against the fp32 reference's.
  const auto lse_ref = kiln::ops::flash_attention_forward(in.q.to(at::kFloat), in.k.to(at::kFloat), in.v.to(at::kFloat),
                                                          {.causal = c.causal, .segment_ids = in.seg});
  CHECK(max_abs_diff(lse, lse_ref.lse) < 2e-2);
}

}  // namespace

TEST_CASE("flash-attention CUDA kernels (emulated on CPU): forward and gradients match the fp32 reference",
          "[ops][flash][emulated]") {
  // Several 64 x 64 tiles with ragged ends, causal, GQA 2, bf16 and fp16, both head dims.
  check_case({at::kBFloat16, 64, 4, 2, 100, 100, true});
  check_case({at::kHalf, 128, 2, 2, 70, 70, true});
  // One row; non-causal with more keys than queries; decoding shape (bottom-right causal).
  check_case({at::kBFloat16, 64, 2, 1, 1, 1, true});
  check_case({at::kHalf, 64, 4, 1, 17, 80, false});
  check_case({at::kBFloat16, 128, 4, 2, 5, 70, true});
}

TEST_CASE("flash-attention CUDA kernels (emulated): segment masks and the deterministic dQ kernel",
          "[ops][flash][emulated]") {
  check_case({at::kBFloat16, 64, 2, 1, 90, 90, true, /*segments=*/true});
  check_case({at::kHalf, 64, 2, 2, 70, 70, false, /*segments=*/true});
  check_case({at::kBFloat16, 64, 4, 2, 100, 100, true, false, /*deterministic=*/true});
  check_case({at::kBFloat16, 128, 2, 1, 65, 65, true, true, /*deterministic=*/true});
}

TEST_CASE("flash-attention's Volta (sm_70) kernels (emulated): fp16, plain tile loads, the same references",
          "[ops][flash][emulated]") {
  // The same tolerance rule and shapes as above (several tiles, ragged ends, GQA, causal and not,
  // segment masks, both dQ modes), through the variant a V100 runs.
  check_case({at::kHalf, 64, 4, 2, 100, 100, true, false, false, 70});
  check_case({at::kHalf, 64, 4, 1, 17, 80, false, false, false, 70});
  check_case({at::kHalf, 64, 2, 1, 90, 90, true, /*segments=*/true, false, 70});
  check_case({at::kHalf, 64, 4, 2, 100, 100, true, false, /*deterministic=*/true, 70});
  check_case({at::kHalf, 128, 2, 2, 70, 70, true, false, false, 70});  // runs where a block may hold 144 KiB
  // Volta has no bf16 tensor cores, and nothing older than Volta has the fp16 tiles used here.
  const Case bf16{at::kBFloat16, 64, 2, 1, 64, 64, true, false, false, 70};
  CHECK_FALSE(kk::emulated::flash_supported(shape_of<kk::FlashShape>(bf16, at::Tensor())));
  Case older{at::kHalf, 64, 2, 1, 64, 64, true};
  older.arch = 61;
  CHECK_FALSE(kk::emulated::flash_supported(shape_of<kk::FlashShape>(older, at::Tensor())));
  older.arch = 70;
  CHECK(kk::emulated::flash_supported(shape_of<kk::FlashShape>(older, at::Tensor())));
  // The launcher refuses bf16 planned for Volta rather than launching a trap.
  kk::FlashFwdParams p = shape_of<kk::FlashFwdParams>(bf16, at::Tensor());
  CHECK_THROWS_WITH(kk::emulated::launch_flash_fwd(p, nullptr), Catch::Contains("compute capability 8.0"));
  // Head dim 64 fits a V100's 96 KiB per block, 128 does not (the op then runs ATen's attention).
  CHECK(kk::emulated::flash_smem_bytes(64, 70) <= 96 * 1024);
  CHECK(kk::emulated::flash_smem_bytes(128, 70) > 96 * 1024);
}
