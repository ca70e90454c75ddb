// Fused fp32 CPU loops of kiln's element-wise ops: one pass over memory where the ATen
// composition makes one per op. Torch-free like the CUDA kernels beside them: raw pointers and
// sizes, called by ops/rmsnorm.cpp, ops/swiglu.cpp and ops/linear.cpp. Each function splits its
// work into fixed shares over OpenMP threads (LibTorch's runtime and thread count). Each loop is compiled for x86-64-v4
// (AVX-512), x86-64-v3 (AVX2) and the baseline, and the level this CPU supports runs (isa_level). With
// -ffp-contract=off (and -fno-trapping-math -fno-math-errno, which change no result but let the clamps and sqrt
// vectorise) and reductions written as 16 fixed lanes, every level computes the same bits.
#pragma once

#include <cstdint>

namespace kiln::kernels::cpu {

// rows x cols, row-major. h = x (+ residual, written to h_out when residual is given);
// rstd[r] = 1 / sqrt(mean(h[r]^2) + eps); y = w * (h * rstd).
void rmsnorm_forward(const float* x, const float* residual, const float* w, float* y, float* h_out, float* rstd,
                     int64_t rows, int64_t cols, float eps);

// With g = dy w and n = h rstd: dx = rstd (g - n mean(g n)) (+ dh when given);
// dw_acc[c] += sum over the rows of dy n (summed in fixed blocks of rows, in block order: the
// same bits whatever the thread count).
void rmsnorm_backward(const float* h, const float* w, const float* rstd, const float* dy, const float* dh, float* dx,
                      float* dw_acc, int64_t rows, int64_t cols);

// y = silu(g) u, silu(g) = g / (1 + exp(-g)).
void swiglu_forward(const float* g, const float* u, float* y, int64_t n);

// With s = sigmoid(g): dg = dy u s (1 + g (1 - s)), du = dy g s.
void swiglu_backward(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n);

// The same two on bf16 tensors (their uint16 bit patterns): widened to fp32, the formulas above in
// fp32, each result rounded once to the nearest bf16 (ties to even; NaN stays NaN). No fp32 copy
// of a tensor exists at any time.
void swiglu_forward_bf16(const uint16_t* g, const uint16_t* u, uint16_t* y, int64_t n);
void swiglu_backward_bf16(const uint16_t* g, const uint16_t* u, const uint16_t* dy, uint16_t* dg, uint16_t* du,
                          int64_t n);

// Rotary embedding ("rotate half" pairs (i, i + D/2)) over x viewed as [B, H, T, D] with unit stride
// on D: src and dst hold one element's offsets as b * stride[0] + h * stride[1] + t * stride[2] + i
// (dst may be src, with the same strides: in place). cos, sin: [B or 1, T, D] contiguous,
// cs_batch_stride = T * D or 0 (one table for every sequence). With x1 = x[i], x2 = x[i + D/2]:
//   forward:  dst[i] = x1 cos[i] - x2 sin[i],        dst[i + D/2] = x2 cos[i + D/2] + x1 sin[i + D/2]
//   backward: dst[i] = x1 cos[i] + x2 sin[i + D/2],  dst[i + D/2] = x2 cos[i + D/2] - x1 sin[i]
// (the backward is the transposed rotation: the gradient of the forward). Each product and the sum
// rounded as ATen's x * cos + rotate_half(x) * sin rounds them, so the fp32 results are its bits.
struct RopeShape {
  int64_t batch, heads, seq, dim;
  int64_t src_stride[3], dst_stride[3];
  int64_t cs_batch_stride;
};
void rope(const float* src, float* dst, const float* cos, const float* sin, const RopeShape& shape, bool backward);

// The same on bf16 (uint16 bits), rounded as ATen's bf16 ops round: each product to bf16, then the
// sum (its bits too).
void rope_bf16(const uint16_t* src, uint16_t* dst, const uint16_t* cos, const uint16_t* sin, const RopeShape& shape,
               bool backward);

// Autocast's mixed form (bf16 projections, fp32 tables), as ATen's type promotion and autograd
// compute it: the forward of bf16 x into a fresh fp32 y (fp32 products and sum); the backward of
// an fp32 dy into a bf16 dx, each product and the sum rounded to bf16 (the reference's gradient
// is cast to x's dtype per term, and the terms are added in bf16).
void rope_bf16_to_fp32(const uint16_t* src, float* dst, const float* cos, const float* sin, const RopeShape& shape);
void rope_backward_fp32_to_bf16(const float* src, uint16_t* dst, const float* cos, const float* sin,
                                const RopeShape& shape);

// Cross-entropy over the rows of logits [rows, cols] (the chunked loss head's step on one chunk).
// Per row, with t = labels[r] (index 0 stands in for an ignored row): m = max, logs =
// log(sum exp(x - m)), nll = logs - (x[t] - m), lse[r] = x[t] + nll, loss[r] = nll + z_loss lse^2,
// or 0 when t == ignore_index. With write_grad the row is overwritten in place by d loss[r] / dx =
// exp(x - m - logs) (1 + 2 z_loss lse) - onehot(t), all zeros for an ignored row, times grad_scale
// (the gradient the caller expects backward to apply, so that a bf16 result is the scaled
// gradient rounded once; 1 leaves the bits unchanged). Labels must be in [0, cols) or ignore_index
// (the caller checks). Rows are independent: the same bits whatever the thread count.
void cross_entropy_rows(float* logits, const int64_t* labels, int64_t ignore_index, float z_loss, float* loss,
                        float* lse, int64_t rows, int64_t cols, bool write_grad, float grad_scale = 1.0f);

// The same on bf16 logits (uint16 bits): each element widened to fp32, the arithmetic above in
// fp32, the gradient rounded once to bf16 over the logits (what ATen's fp32 log-softmax of bf16
// logits and a cast of its gradient back to bf16 compute, without the fp32 [rows, cols] copies).
void cross_entropy_rows_bf16(uint16_t* logits, const int64_t* labels, int64_t ignore_index, float z_loss, float* loss,
                             float* lse, int64_t rows, int64_t cols, bool write_grad, float grad_scale = 1.0f);

// acc[i] += src[i] widened from bf16: accumulates a bf16 GEMM's product into an fp32 sum without
// the fp32 temporary a mixed-dtype add_ allocates.
void accumulate_bf16(float* acc, const uint16_t* src, int64_t n);

// out = in rounded to the nearest bf16 / fp16 (ties to even) and widened back to fp32, in place
// when out == in: the values a bf16 / fp16 GEMM reads (ops/linear.cpp).
void round_to_bf16(const float* in, float* out, int64_t n);
void round_to_fp16(const float* in, float* out, int64_t n);

// exp(x) for the loops above: Cephes' single-precision range reduction and polynomial, written
// to vectorise (no libm call); within 2 units in the last place of exp over [-87, 88], 0 below
// -87.34 and exp(88) above 88.
float exp_approx(float x);

// 4 (x86-64-v4), 3 (x86-64-v3) or 1 (baseline): the level the loops run at, the highest this CPU
// supports unless testing::force_isa_level chose a lower one.
int isa_level();

namespace testing {
// Runs the loops at min(level, the CPU's) from now on; 0 = the CPU's own again. Tests compare
// the levels bitwise on any machine.
void force_isa_level(int level);
}  // namespace testing

}  // namespace kiln::kernels::cpu
