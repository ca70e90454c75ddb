// The traffic model (traffic.h). Every count below is per instance of a row: one decoder layer of
// one micro-batch, one micro-batch, or one optimizer step. Notation: N = B x T tokens of a
// micro-batch; H hidden, q = heads x d and kv = kv_heads x d the projections' widths, F the MLP
// width, V the vocabulary; c = bytes of the compute dtype (2 under bf16/fp16 autocast, 4 in fp32);
// fp32 tensors (the residual stream, parameters, gradients, the RoPE tables) 4 bytes. "R x W y"
// means an op reads x bytes and writes y bytes. Biases (LLaMA has none) are not counted.
#include "kiln/cost/traffic.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/cost/flops.h"

namespace kiln::cost {

std::string pass_name(Pass pass) {
  switch (pass) {
    case Pass::kForward:
      return "fwd";
    case Pass::kBackward:
      return "bwd";
    case Pass::kRecompute:
      return "recompute";
    case Pass::kStep:
      return "step";
  }
  return "?";
}

double Cost::intensity() const {
  return bytes > 0 ? flops() / bytes : 0.0;
}

Cost& Cost::operator+=(const Cost& o) {
  gemm_flops += o.gemm_flops;
  other_flops += o.other_flops;
  bytes += o.bytes;
  return *this;
}

Cost Cost::scaled(double times) const {
  return {gemm_flops * times, other_flops * times, bytes * times};
}

namespace {

Cost rw(double read, double write) {
  return {0, 0, read + write};
}

Cost other(double flops, double read, double write) {
  return {0, flops, read + write};
}

// A pass and its gradient: the costs of one instance of a component.
struct Passes {
  Cost fwd, bwd;
};

// y [M, n_out] = x [M, k] W^T, W [n_out, k], all in e-byte elements (the compute dtype: the
// autocast copy of the weight under bf16/fp16). Forward reads x and W, writes y. Backward:
// dx = dy W (R dy, W; W dx) and dW = dy^T x (R dy, x; W dW): 2 GEMMs of the forward's FLOPs.
// With an L2 in `dram`, each of the three adds its operands' re-reads (gemm_reread_bytes, C [M, N]
// = A [M, K] B [K, N]):
//   forward  y = x W^T:   A = x [m, k],        B = W^T [k, n_out]  (M m, K k, N n_out)
//   dx       dx = dy W:   A = dy [m, n_out],   B = W [n_out, k]    (M m, K n_out, N k)
//   dW       dW = dy^T x: A = dy^T [n_out, m], B = x [m, k]        (M n_out, K m, N k)
Passes gemm(double m, double k, double n_out, double e, const GemmDram& dram) {
  const double flops = 2.0 * m * k * n_out;
  const double fwd_rereads = gemm_reread_bytes(m, k, n_out, e, dram);
  const double bwd_rereads = gemm_reread_bytes(m, n_out, k, e, dram) + gemm_reread_bytes(n_out, m, k, e, dram);
  return {{flops, 0, e * (m * k + k * n_out + m * n_out) + fwd_rereads},
          {2.0 * flops, 0, e * 2.0 * (m * n_out + m * k + k * n_out) + bwd_rereads}};
}

// RMSNorm over n rows of h fp32 elements (the residual stream), fp32 weight and output.
// kiln's kernels (kernels/rmsnorm.cu): forward R x, w; W y and rstd (one fp32 per row, saved for
// backward: backward does not recompute it). Backward R x, w, rstd, dy; W dx, dweight (the per-block
// partial rows of dweight, 2 x SMs x h, are left out: under 0.1% at llama-100m's sizes).
// FLOPs: forward square, sum, scale by 1/rms, by the weight (4 per element, as flops.h);
// backward n = x rstd, g = dy w, sum(g n) (2), dx = rstd (g - n mean) (3), dweight (2): 9.
Passes rmsnorm_fused(double n, double h) {
  return {other(4 * n * h, 4 * n * h + 4 * h, 4 * n * h + 4 * n),
          other(9 * n * h, 4 * n * h + 4 * h + 4 * n + 4 * n * h, 4 * n * h + 4 * h)};
}

// HF's LlamaRMSNorm (and kiln's rmsnorm=aten), whole-tensor ops on the fp32 stream (its
// .to(float32) and .to(input_dtype) are no-ops there):
//   forward  x.pow(2) R 4nh W 4nh; .mean(-1) R 4nh W 4n; + eps R 4n W 4n; rsqrt R 4n W 4n;
//            x * r R 4nh + 4n W 4nh; weight * that R 4nh + 4h W 4nh          = 28 nh + 24 n + 4 h
//   backward (autograd) dy * w R 4nh + 4h W 4nh; dweight: dy * n R 8nh W 4nh, sum R 4nh W 4h;
//            g * r R 4nh + 4n W 4nh; (g * x).sum(-1) R 8nh W 4nh + R 4nh W 4n; rsqrt's backward
//            (-0.5 g r^3: pow, mul, mul on [n]) R 16n W 12n; mean's (expand / h) R 4n W 4nh;
//            pow's (g * (2 * x.pow(1)): pow copy, x 2, x g) R 16nh W 12nh; the two gradients of x
//            summed R 8nh W 4nh                                                = 92 nh + 40 n + 8 h
Passes rmsnorm_unfused(double n, double h) {
  return {other(4 * n * h + 2 * n, 16 * n * h + 12 * n + 4 * h, 12 * n * h + 12 * n),
          other(10 * n * h + 3 * n, 56 * n * h + 24 * n + 4 * h, 36 * n * h + 16 * n + 4 * h)};
}

// SwiGLU over e elements of gate and up (c bytes each). kiln's kernel (kernels/swiglu.cu): forward
// R gate, up W y; backward R gate, up, dy W dgate, dup (silu recomputed in registers).
// FLOPs: forward sigmoid (exp, add, divide), x gate, x up: 5 (flops.h); backward sigmoid (3),
// silu (1), d_up (1), d_gate = dy up s (1 + gate (1 - s)) (6): 11.
Passes swiglu_fused(double e, double c) {
  return {other(5 * e, 2 * c * e, c * e), other(11 * e, 3 * c * e, 2 * c * e)};
}

// silu(gate) * up as two ATen ops: forward silu R W, mul R 2 W 1; backward (autograd) dy * up,
// dy * silu (R 2 W 1 each) and silu's backward (R dsilu, gate W 1).
Passes swiglu_unfused(double e, double c) {
  return {other(5 * e, 3 * c * e, 2 * c * e), other(9 * e, 6 * c * e, 3 * c * e)};
}

// RoPE as ATen's composition on e elements of xb bytes (q or k as the projection wrote them),
// with fp32 tables [B, T, d] (nd = N x d elements each): HF's apply_rotary_pos_emb and kiln's
// reference (ops/rope.cpp), which kiln's model takes under autocast. Mixed dtypes promote: the
// result is fp32.
//   forward  -x2 R xb e/2 W xb e/2; cat R xb e W xb e; x cos R xb e + 4nd W 4e;
//            rotated sin R xb e + 4nd W 4e; sum R 8e W 4e                       = 5 xb e + 20 e + 8 nd
//   backward (autograd, dy fp32) dy cos, dy sin R 4e + 4nd W 4e each, each cast to xb when
//            xb < 4 (R 4e W xb e); -() R xb e/2 W xb e/2; both narrows' backward (zeros of e, the
//            half copied in) 2 xb e each; the three gradients of x summed R 4 xb e W 2 xb e
// `copy_back`: the aten backend outside autocast writes the result back into x (R 4e W 4e).
Passes rope_unfused(double e, double xb, double nd, bool copy_back) {
  const bool cast = xb < 4;
  return {other(3.5 * e, 3.5 * xb * e + 8 * nd + 8 * e + (copy_back ? 4 * e : 0.0),
                1.5 * xb * e + 12 * e + (copy_back ? 4 * e : 0.0)),
          other(4.5 * e, 8 * e + 8 * nd + 5.5 * xb * e + (cast ? 8 * e : 0.0),
                8 * e + 5.5 * xb * e + (cast ? 2 * xb * e : 0.0))};
}

// kiln's RoPE kernel in place on e fp32 elements (fp32 compute): forward R x, cos, sin W x;
// backward clones dy (R W) and rotates the clone in place (R x, cos, sin W x).
Passes rope_fused(double e, double nd) {
  return {other(3 * e, 4 * e + 8 * nd, 4 * e), other(3 * e, 8 * e + 8 * nd, 8 * e)};
}

// kiln's mixed-dtype RoPE under autocast (ops/rope.cpp's mixed Function) on e elements of xb bytes,
// out of place: forward R x, cos, sin W y (fp32); backward R dy (fp32), cos, sin W dx (xb).
Passes rope_mixed_fused(double e, double xb, double nd) {
  return {other(3 * e, xb * e + 8 * nd, 4 * e), other(3 * e, 4 * e + 8 * nd, xb * e)};
}

struct AttentionShape {
  double n = 0, eq = 0, ekv = 0;  // tokens; q and k/v elements of a micro-batch (N q, N kv)
  double rows = 0;                // N x heads: rows of the log-sum-exp
  double causal = 0, full = 0;    // score elements: B heads T (T + 1) / 2 and B heads T^2
  double d = 0;                   // head_dim
  double mask = 0;                // B T^2: HF's additive fp32 mask [B, 1, T, T]
  double tt = 0;                  // T^2: SDPA's causal bool mask
  bool gqa = false;
};

// kiln's flash-attention kernels (kernels/flash_attention.cu, ops/flash_attention_cuda.cpp) under
// autocast (c = 2): q and k arrive fp32 from RoPE's promotion, v in the compute dtype.
//   forward  ops::attention casts q, k (R 4 W 2); the glue's .contiguous() copies q, k (laid out
//            [B, T, heads, d]) and v (a transposed view) (R 2 W 2); the kernel R q, k, v W out,
//            lse (fp32 per row); o_proj's input is the output merged to [B, T, q] (a copy)
//                                                                         = 18 eq + 18 ekv + 4 rows
//   backward dout copied contiguous and q, k, v again (the saved tensors are the views);
//            D = rowsum(dout out) R 2 eq + 2 eq W 4 rows; the fp32 dq accumulator zeroed (W 4 eq),
//            added to with atomics (R W 4 eq); dk/dv kernel R q, k, v, dout, lse, D W dk, dv;
//            dq converted (R 4 eq W 2 eq); dq, dk cast back to fp32 for RoPE (R 2 W 4)
//                                                                         = 40 eq + 22 ekv + 12 rows
// No T x T tensor: backward recomputes P = exp(QK^T - lse) tile by tile (one more QK^T product:
// 2.5x the forward's matmul FLOPs executed, 2x counted as model FLOPs).
Passes attention_flash(const AttentionShape& s) {
  const double fwd_gemm = 4 * s.causal * s.d;
  return {{fwd_gemm, 5 * s.causal, 18 * s.eq + 18 * s.ekv + 4 * s.rows},
          {2.5 * fwd_gemm, 5 * s.causal, 40 * s.eq + 22 * s.ekv + 12 * s.rows}};
}

// ATen's SDPA with a fused backend (flash, memory-efficient): the same algorithm without kiln's
// glue copies. Under autocast SDPA's inputs are cast (R 4 W c). Forward R q, k, v W out, lse; the
// merged output copy for o_proj. Backward D (R 2c eq W 4 rows); the main kernel R q, k, v, out,
// dout, lse, D W dq, dk, dv; dq accumulated in fp32 (zeroed, R W with atomics, converted when
// c < 4); dq, dk cast back under autocast.
Passes attention_sdpa(const AttentionShape& s, double c, bool autocast) {
  const double fwd_gemm = 4 * s.causal * s.d;
  const double casts = autocast ? 6 * s.eq + 6 * s.ekv : 0.0;
  const double fwd = casts + c * (s.eq + 2 * s.ekv) + c * s.eq + 4 * s.rows + 2 * c * s.eq;
  const double dq_acc = c < 4 ? 4 * s.eq + 8 * s.eq + 4 * s.eq + c * s.eq : 12 * s.eq;
  const double casts_back = autocast ? (c + 4) * (s.eq + s.ekv) : 0.0;
  const double bwd =
      (2 * c * s.eq + 4 * s.rows) + (c * (2 * s.eq + 2 * s.ekv) + 8 * s.rows + c * (2 * s.ekv)) + dq_acc + casts_back;
  return {{fwd_gemm, 5 * s.causal, fwd}, {2.5 * fwd_gemm, 5 * s.causal, bwd}};
}

// SDPA's math backend: the T x T scores and probabilities materialised over the full square (the
// causal mask is applied, not skipped), in fp32 (it upcasts bf16/fp16 inputs unless
// allowFP16BF16ReductionMathSDP is set). Forward: autocast's casts of q, k; the upcast of q, k, v
// (R c W 4); q and k scaled (R W 4 each); K/V repeated for GQA (R 4 ekv W 4 eq each); QK^T
// (W 4 full); the causal mask (R 4 full + T^2 bools W 4 full); softmax (R W 4 full); PV; the output
// cast to c and merged for o_proj. Backward mirrors it: the out cast, dP = dO V^T, dV = P^T dO,
// softmax's backward (R 8 W 4 per score), the mask's, dQ = dS K, dK = dS^T Q, the scalings, the
// GQA sums and the casts back.
Passes attention_math(const AttentionShape& s, double c, bool autocast) {
  const double eqr = s.gqa ? s.eq : s.ekv;                           // k, v after the GQA repeat
  const double casts = autocast ? (4 + c) * (s.eq + s.ekv) : 0.0;    // autocast: q, k to c
  const double upcast = c < 4 ? (c + 4) * (s.eq + 2 * s.ekv) : 0.0;  // q, k, v to fp32
  const double scale = 8 * s.eq + 8 * s.ekv;                         // q, k x sqrt(scale)
  const double repeat = s.gqa ? 2 * (4 * s.ekv + 4 * s.eq) : 0.0;    // forward copies, backward sums
  const double out_cast = c < 4 ? (4 + c) * s.eq : 0.0;
  const double fwd = casts + upcast + scale + repeat + (4 * (s.eq + eqr) + 4 * s.full) + (8 * s.full + s.tt) +
                     8 * s.full + (4 * s.full + 4 * eqr + 4 * s.eq) + out_cast + 2 * c * s.eq;
  const double bwd = out_cast + (4 * (s.eq + eqr) + 4 * s.full) + (4 * s.full + 4 * (s.eq + eqr)) + 12 * s.full +
                     (8 * s.full + s.tt) + 2 * (4 * s.full + 4 * (s.eq + eqr)) + scale + repeat + upcast + casts;
  const double fwd_gemm = 4 * s.full * s.d;
  return {{fwd_gemm, 7 * s.full, fwd}, {2 * fwd_gemm, 4 * s.full, bwd}};
}

// HF's eager_attention_forward under autocast: q, k fp32 (RoPE promoted them), v in c bytes.
//   forward  repeat_kv for GQA (k R 4 ekv W 4 eq, v R c ekv W c eq); matmul(q, k^T): autocast casts q
//            and k (R 4 W c), q's [B, T, heads, d] layout copied for bmm (R W c eq; k too without
//            GQA), scores W c full; x scaling R W c full; + causal_mask (fp32 [B, 1, T, T]) R c full
//            + 4 mask W 4 full; softmax(dtype=fp32) R W 4 full (.to(query.dtype) is fp32: no-op);
//            matmul(P, v): autocast casts P R 4 W c full, v's layout copied without GQA, out W c eq;
//            transpose(1, 2).contiguous() R W c eq
//   backward dO's layout copied for bmm; dP = dO V^T W c full; dV = P^T dO; P's cast back R c W 4
//            full; softmax's backward R 8 W 4 full; the mask add's gradient cast to the scores' dtype
//            R 4 W c full; x scaling R W c full; dQ = dS K, dK = dS^T Q; q, k cast back (R c W 4);
//            repeat_kv's sums for GQA
// In fp32 (c = 4) the casts are no-ops and left out. FLOPs: the full square, not the causal half.
Passes attention_eager(const AttentionShape& s, double c, bool autocast) {
  const double eqr = s.gqa ? s.eq : s.ekv;
  const double repeat = s.gqa ? (4 * s.ekv + 4 * s.eq) + (c * s.ekv + c * s.eq) : 0.0;
  const double qk_casts = autocast ? (4 + c) * (s.eq + eqr) : 0.0;
  const double layout = 2 * c * s.eq + (s.gqa ? 0.0 : 2 * c * s.ekv);  // q (and k) for QK^T
  const double v_layout = s.gqa ? 0.0 : 2 * c * s.ekv;
  const double fwd = repeat + qk_casts + layout + c * (s.eq + eqr) + c * s.full + 2 * c * s.full +
                     (c * s.full + 4 * s.mask + 4 * s.full) + 8 * s.full + (autocast ? (4 + c) * s.full : 0.0) +
                     v_layout + (c * s.full + c * eqr + c * s.eq) + 2 * c * s.eq;
  const double bwd = 2 * c * s.eq + (c * (s.eq + eqr) + c * s.full) + (c * s.full + c * s.eq + c * eqr) +
                     (autocast ? (c + 4) * s.full : 0.0) + 12 * s.full + (autocast ? (4 + c) * s.full : 0.0) +
                     2 * c * s.full + (c * s.full + c * eqr + c * s.eq) + (c * s.full + c * s.eq + c * eqr) +
                     (autocast ? (c + 4) * (s.eq + eqr) : 0.0) +
                     (s.gqa ? (4 * s.eq + 4 * s.ekv) + (c * s.eq + c * s.ekv) : 0.0);
  const double fwd_gemm = 4 * s.full * s.d;
  return {{fwd_gemm, 7 * s.full, fwd}, {2 * fwd_gemm, 4 * s.full, bwd}};
}

}  // namespace

double gemm_reread_bytes(double m, double k, double n, double e, const GemmDram& dram) {
  if (dram.l2_bytes < 0) throw std::invalid_argument("gemm_reread_bytes: l2_bytes must be >= 0");
  if (!(dram.tile_m >= 1) || !(dram.tile_n >= 1)) {
    throw std::invalid_argument("gemm_reread_bytes: tile_m and tile_n must be >= 1");
  }
  if (!(dram.sms >= 0)) throw std::invalid_argument("gemm_reread_bytes: sms must be >= 0");
  if (dram.l2_bytes == 0) return 0.0;
  // The GEMM's output tiles (traffic.h, GemmDram): ceil(M / tm) rows and ceil(N / tn) columns of
  // them; each tile reads its tm x K slice of A and its K x tn slice of B. Compulsory traffic reads
  // each operand once; without the L2 holding one of them, A is read again for every further tile
  // column or B for every further tile row, whichever the schedule makes cheaper. When the smaller
  // operand fits in half the L2 (the other half for the streaming operand's tiles and C's), it
  // stays resident and nothing is re-read.
  const double bytes_a = e * m * k, bytes_b = e * k * n;
  if (std::min(bytes_a, bytes_b) <= dram.l2_bytes / 2) return 0.0;
  // A wave of `sms` tiles shares its slices through the L2: blocks of w x w tiles (traffic.h).
  const double w = dram.sms > 0 ? std::ceil(std::sqrt(dram.sms)) : 1.0;
  const double block_rows = std::ceil(m / (w * dram.tile_m)), block_cols = std::ceil(n / (w * dram.tile_n));
  return std::min(bytes_a * (block_cols - 1), bytes_b * (block_rows - 1));
}

LossHeadAccumulator loss_head_accumulator(int64_t tokens, int64_t vocab, int64_t hidden, int64_t chunk_tokens,
                                          bool zero_filled) {
  if (chunk_tokens < 1) throw std::invalid_argument("loss_head_accumulator: chunk_tokens must be >= 1");
  LossHeadAccumulator acc;
  const double vh = static_cast<double>(vocab) * static_cast<double>(hidden);
  acc.chunk_tokens = chunk_tokens;
  acc.chunks = (tokens + chunk_tokens - 1) / chunk_tokens;
  acc.bytes_per_chunk = 8 * vh;
  // The zero fill or the first chunk's plain write (W 4 VH), then R + W 8 VH per chunk adding in.
  acc.bytes = 4 * vh + acc.bytes_per_chunk * static_cast<double>(zero_filled ? acc.chunks : acc.chunks - 1);
  return acc;
}

namespace {

// transformers' LlamaSdpaAttention (4.45) under autocast: q, k, v arrive in the compute dtype c;
// repeat_kv copies K and V to every query head (R c ekv W c eq each; backward sums them back, R c eq
// W c ekv each); SDPA's fused kernel then sees no GQA and no casts. In fp32 the same without casts.
Passes attention_sdpa_hf(const AttentionShape& s, double c) {
  AttentionShape repeated = s;
  double repeat_fwd = 0, repeat_bwd = 0;
  if (s.gqa) {
    repeated.ekv = s.eq;
    repeat_fwd = 2 * (c * s.ekv + c * s.eq);
    repeat_bwd = 2 * (c * s.eq + c * s.ekv);
  }
  Passes p = attention_sdpa(repeated, c, false);
  p.fwd.bytes += repeat_fwd;
  p.bwd.bytes += repeat_bwd;
  return p;
}

}  // namespace

TrafficReport traffic_model(const model::LlamaConfig& config, const RunDescription& o, const EagerStack& es,
                            const GemmDram& dram) {
  o.validate();
  const model::LlamaConfig& m = config;
  const double b = static_cast<double>(o.batch), t = static_cast<double>(o.cutoff_len);
  const double a = static_cast<double>(o.gradient_accumulation_steps), n = b * t;
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.intermediate_size);
  const double v = static_cast<double>(m.vocab_size), layers = static_cast<double>(m.num_hidden_layers);
  const double d = static_cast<double>(m.resolved_head_dim());
  const double heads = static_cast<double>(m.num_attention_heads), kv_heads = static_cast<double>(m.kv_heads());
  const double q = heads * d, kv = kv_heads * d;
  const bool autocast = o.dtype != "fp32";
  const double c = compute_dtype_bytes(o.dtype);
  const double p = static_cast<double>(m.num_parameters());
  const double world = static_cast<double>(o.parallel.world_size);
  const KernelChoices& k = o.kernels;
  const FlopsPerToken per_token = flops_per_token(m, o.cutoff_len);

  TrafficReport r;
  r.model = m;
  r.run = o;
  r.num_parameters = m.num_parameters();
  r.tokens_per_step = n * a;
  auto add = [&](const std::string& name, Pass pass, double repeats, const Cost& kiln, const Cost& eager,
                 double model_flops, bool layer) {
    r.rows.push_back({name, pass, repeats, kiln, eager, model_flops, layer});
  };
  auto add_passes = [&](const std::string& name, double repeats, const Passes& kiln, const Passes& eager, bool layer) {
    add(name, Pass::kForward, repeats, kiln.fwd, eager.fwd, kiln.fwd.gemm_flops, layer);
    add(name, Pass::kBackward, repeats, kiln.bwd, eager.bwd, 2.0 * kiln.fwd.gemm_flops, layer);
  };
  const double per_layer = layers * a;  // a decoder layer's component, per step

  // ---- Embedding lookup: R ids (int64) and N fp32 rows, W them. Backward (ATen's dense
  // embedding backward): the fp32 [V, H] gradient zero-filled, dY read, each touched row written
  // (at most min(N, V)); the index sort is left out. A tied embedding's two gradients (lookup and
  // LM head) are summed into one (R 8 VH W 4 VH).
  const double touched = std::min(n, v);
  const Cost emb_fwd = rw(8 * n + 4 * n * h, 4 * n * h);
  const Cost emb_bwd = {0, n * h + (m.tie_word_embeddings ? v * h : 0.0),
                        4 * v * h + 8 * n + 4 * n * h + 4 * touched * h + (m.tie_word_embeddings ? 12 * v * h : 0.0)};
  add("embedding lookup", Pass::kForward, a, emb_fwd, emb_fwd, 0, false);
  add("embedding lookup", Pass::kBackward, a, emb_bwd, emb_bwd, 0, false);

  // ---- RoPE tables, once per forward (model/rope.cpp): positions R 8N W 4N as fp32; x inv_freq
  // R 4N W 2Nd; cat R 2Nd W 4Nd; cos, sin R 4Nd W 4Nd each (.to(fp32) a no-op). HF's
  // LlamaRotaryEmbedding: the same through a [d/2, 1] x [1, T] matmul, and both tables multiplied
  // by attention_scaling (R W 4Nd each more).
  const double nd = n * d;
  add("RoPE tables (cos, sin)", Pass::kForward, a, other(n * d / 2 + 2 * nd, 12 * n + 10 * nd, 4 * n + 14 * nd),
      {n * d, 4 * nd, 16 * n + 40 * nd}, 0, false);

  // ---- Decoder layer.
  const Passes norm_kiln = k.fused_rmsnorm ? rmsnorm_fused(n, h) : rmsnorm_unfused(n, h);
  const Passes norm_eager = rmsnorm_unfused(n, h);
  add_passes("input RMSNorm", per_layer, norm_kiln, norm_eager, true);
  // The projections: pure GEMMs in the compute dtype (autocast's casts are their own row).
  const Passes q_proj = gemm(n, h, q, c, dram), kv_proj = gemm(n, h, kv, c, dram);
  add_passes("q_proj", per_layer, q_proj, q_proj, true);
  add_passes("k_proj", per_layer, kv_proj, kv_proj, true);
  add_passes("v_proj", per_layer, kv_proj, kv_proj, true);

  // RoPE on q and k. The projections' outputs are c bytes; tables fp32.
  const bool rope_kernel = k.fused_rope && !autocast, rope_mixed = k.fused_rope && k.mixed_rope_fused && autocast;
  Passes rope_kiln, rope_eager;
  for (const double e : {n * q, n * kv}) {
    const Passes kp = rope_kernel  ? rope_fused(e, nd)
                      : rope_mixed ? rope_mixed_fused(e, c, nd)
                                   : rope_unfused(e, c, nd, !autocast);
    const Passes ep = rope_unfused(e, c, nd, false);
    rope_kiln.fwd += kp.fwd, rope_kiln.bwd += kp.bwd, rope_eager.fwd += ep.fwd, rope_eager.bwd += ep.bwd;
  }
  add_passes("RoPE (q, k)", per_layer, rope_kiln, rope_eager, true);

  AttentionShape as;
  as.n = n, as.eq = n * q, as.ekv = n * kv, as.rows = n * heads, as.d = d, as.gqa = kv_heads < heads;
  as.causal = b * heads * t * (t + 1) / 2, as.full = b * heads * t * t, as.mask = b * t * t, as.tt = t * t;
  const Passes attn_kiln = k.attention == "flash"  ? attention_flash(as)
                           : k.attention == "sdpa" ? attention_sdpa(as, c, autocast)
                                                   : attention_math(as, c, autocast);
  const Passes attn_eager = es.sdpa_attention ? attention_sdpa_hf(as, c) : attention_eager(as, c, autocast);
  // Model FLOPs: flops.h's causal count, forward and twice it for backward, whatever runs.
  const double attn_model = per_token.attention_forward / layers * n;
  add("attention core", Pass::kForward, per_layer, attn_kiln.fwd, attn_eager.fwd, attn_model, true);
  add("attention core", Pass::kBackward, per_layer, attn_kiln.bwd, attn_eager.bwd, 2 * attn_model, true);

  const Passes o_proj = gemm(n, q, h, c, dram);
  add_passes("o_proj", per_layer, o_proj, o_proj, true);

  // Residual adds, two per layer: x (fp32) + branch (c) -> fp32, R 4NH + cNH W 4NH. Backward: the
  // gradient passes to the fp32 side as it is; the branch's is cast to c under autocast (R 4 W c).
  const Cost res_fwd = other(2 * n * h, 2 * (4 * n * h + c * n * h), 2 * 4 * n * h);
  const Cost res_bwd = autocast ? rw(2 * 4 * n * h, 2 * c * n * h) : Cost{};
  add("residual adds (2)", Pass::kForward, per_layer, res_fwd, res_fwd, 0, true);
  add("residual adds (2)", Pass::kBackward, per_layer, res_bwd, res_bwd, 0, true);

  add_passes("post-attention RMSNorm", per_layer, norm_kiln, norm_eager, true);
  const Passes up = gemm(n, h, f, c, dram), down = gemm(n, f, h, c, dram);
  add_passes("gate_proj", per_layer, up, up, true);
  add_passes("up_proj", per_layer, up, up, true);
  add_passes("SwiGLU", per_layer, k.fused_swiglu ? swiglu_fused(n * f, c) : swiglu_unfused(n * f, c),
             swiglu_unfused(n * f, c), true);
  add_passes("down_proj", per_layer, down, down, true);

  // Autocast's casts around the layer's GEMMs (bf16/fp16 only). Forward: each fp32 weight cast
  // once per micro-batch (autocast's cache lives for one forward: train/gradient_accumulation.cpp clears it), R 4 W
  // c per weight element; the fp32 norm outputs cast before each of q, k, v and gate, up (autocast
  // does not cache activations), R 4NH W cNH each; selective recomputation casts each norm output
  // once (train/recompute_layers.cpp). Backward: each weight's gradient (c bytes from the
  // GEMM) cast to fp32 (R c W 4), and each of those five inputs' gradients (R c W 4 per NH).
  const double layer_weights = h * q + 2 * h * kv + q * h + 3 * h * f;
  const bool selective = o.recompute == "selective";
  const double input_casts = selective ? 2.0 : 5.0;
  const Cost casts_fwd =
      autocast ? rw(4 * layer_weights + 4 * input_casts * n * h, c * layer_weights + c * input_casts * n * h) : Cost{};
  const Cost casts_bwd = autocast ? rw(c * layer_weights + 5 * c * n * h, 4 * layer_weights + 5 * 4 * n * h) : Cost{};
  add("autocast casts", Pass::kForward, per_layer, casts_fwd, casts_fwd, 0, true);
  add("autocast casts", Pass::kBackward, per_layer, casts_bwd, casts_bwd, 0, true);

  // Autograd's sums where a tensor feeds several ops, fp32 [N, H] each (R 8NH W 4NH per add): the
  // input norm's output feeds q, k, v (2 adds) and the post-attention norm's gate, up (1), and the
  // residual stream x and h each feed a norm and a residual add (2).
  const Cost sums = other(5 * n * h, 5 * 8 * n * h, 5 * 4 * n * h);
  add("gradient sums (autograd)", Pass::kBackward, per_layer, sums, sums, 0, true);

  // ---- Final RMSNorm.
  add_passes("final RMSNorm", a, norm_kiln, norm_eager, false);

  // ---- LM head + loss over all N rows. Model FLOPs 2NVH forward, 4NVH for the gradients.
  // ATen's log_softmax over rows too long for shared memory (V fp32 logits, past the 48-228 KiB an
  // SM holds: aten/src/ATen/native/cuda/SoftMax.cu, cunn_SoftMaxForward) passes over each row three
  // times (its max, its sum of exponentials, the write) and its backward (cunn_SoftMaxBackward)
  // twice over the incoming gradient (its sum, the write); the compulsory count above takes one
  // read each. The repeats come from the L2 unless the rows in flight, one per SM, exceed it: then
  // they are DRAM traffic, 8 bytes per logit forward and 4 backward (with GemmDram's L2 and SMs).
  Passes softmax_rereads;
  if (dram.l2_bytes > 0 && dram.sms > 0 && dram.sms * 4 * v > dram.l2_bytes) {
    softmax_rereads.fwd.bytes = 8 * n * v;
    softmax_rereads.bwd.bytes = 4 * n * v;
  }
  Passes head_kiln, head_eager;
  const double head_fwd = 2 * n * v * h;
  {
    // The eager head: at::linear under autocast (hidden cast R 4NH W cNH, the weight R 4VH W cVH),
    // logits W cNV; logits.float() R cNV W 4NV; cross_entropy: log_softmax R W 4NV, nll_loss
    // (a gather). Backward: nll_loss's dense gradient W 4NV; log_softmax's R 8NV W 4NV; the
    // float() cast back R 4NV W cNV; dX, dW GEMMs; hidden and weight gradients cast back to fp32.
    // FLOPs: log_softmax max, subtract, exp, sum (4 per logit), its backward 3. With an L2 in
    // `dram` its three GEMMs add their re-reads as the projections' do (gemm()).
    const double casts = autocast ? (4 + c) * (n * h + v * h) : 0.0;
    const double upcast = autocast ? (c + 4) * n * v : 0.0;
    const Passes g = gemm(n, h, v, c, dram);
    head_eager.fwd = {g.fwd.gemm_flops, 4 * n * v, g.fwd.bytes + casts + upcast + 8 * n * v + 16 * n};
    head_eager.bwd = {g.bwd.gemm_flops, 3 * n * v, g.bwd.bytes + casts + upcast + 4 * n * v + 12 * n * v};
    head_eager.fwd.bytes += softmax_rereads.fwd.bytes;
    head_eager.bwd.bytes += softmax_rereads.bwd.bytes;
    // kiln's linear_ce=aten head is the same chain (ops::linear_cross_entropy_reference: the trainer
    // always takes the loss through ops::linear_cross_entropy, whose labels are shifted instead of
    // the logits, so no copy of them is made).
    head_kiln = head_eager;
    if (es.shifted_logits_copy) {
      // transformers 4.45: shift_logits = logits[..., :-1, :].contiguous() (R 4NV W 4NV); its
      // backward zero-fills the full gradient and copies the slice in (W 4NV, R 4NV W 4NV).
      head_eager.fwd.bytes += 8 * n * v;
      head_eager.bwd.bytes += 12 * n * v;
    }
  }
  if (k.fused_loss_head) {
    // kiln's chunked linear + cross-entropy (ops/linear_cross_entropy.cpp): the gradients are
    // formed in the forward call (as Liger-Kernel does) and only scaled in backward, so nothing is
    // recomputed. hb: the head's matmul dtype (c under CUDA autocast, fp32 otherwise). Per chunk of
    // r rows (k chunks): logits = h_r W^T (R hb (rH + VH) W hb rV); the loss kernel R logits,
    // labels W the gradient over them and loss, lse (fp32 per row); dh_r = G W (R hb (rV + VH) W
    // hb rH); dW += G^T h_r into the fp32 accumulator (R hb (rV + rH) + 4VH W 4VH; in fp32 the
    // first chunk writes it without reading). Once: hidden and weight cast to hb (R 4 W hb), the
    // accumulator zeroed in the mixed case (W 4VH) and cast to hb at the end (R 4VH W hb VH).
    // The weight is read twice and the fp32 accumulator read and written once per chunk: 4 hb VH +
    // 8 VH bytes per chunk whatever its rows (loss_head_accumulator), so the chunk rule
    // (ops::auto_chunk_tokens on CUDA: at least 1024 rows and at least H, at most N) sets k.
    // Backward: grad_hidden and grad_weight scaled by the loss's gradient (R W hb), then cast back
    // to fp32 (R hb W 4) through the forward's casts. GemmDram's re-read term is not applied here:
    // the chunks' GEMMs keep their compulsory bytes (traffic.h).
    const bool low = autocast && k.loss_head_low_precision;
    const double hb = low ? c : 4.0;
    r.loss_head_accumulator =
        loss_head_accumulator(o.batch * o.cutoff_len, m.vocab_size, m.hidden_size,
                              k.loss_chunk_tokens(o.batch * o.cutoff_len, m.vocab_size, m.hidden_size), low);
    const double chunks = static_cast<double>(r.loss_head_accumulator.chunks);
    const double casts_in = low ? (4 + hb) * (n * h + v * h) : 0.0;
    head_kiln.fwd = {head_fwd, 5 * n * v,
                     casts_in + hb * (n * h + chunks * v * h + n * v) + (2 * hb * n * v + 8 * n + 8 * n) + 16 * n};
    const double acc = r.loss_head_accumulator.bytes;
    head_kiln.bwd = {2 * head_fwd, n * h + v * h,
                     hb * (n * v + chunks * v * h + n * h) + hb * (n * v + n * h) + acc +
                         (low ? (4 + hb) * v * h : 0.0) + 2 * hb * (n * h + v * h) +
                         (low ? (hb + 4) * (n * h + v * h) : 0.0)};
  }
  add("LM head + loss", Pass::kForward, a, head_kiln.fwd, head_eager.fwd, head_fwd, false);
  add("LM head + loss", Pass::kBackward, a, head_kiln.bwd, head_eager.bwd, 2 * head_fwd, false);

  // ---- Gradient accumulation: the first micro-batch's gradients become .grad (stolen, no copy;
  // zero_grad sets them to None), every later one is added in, R 8 W 4 per parameter. Under ZeRO-2
  // each rank accumulates its shard only.
  const bool sharded_grads = o.parallel.world_size > 1 && o.parallel.zero_stage == 2;
  if (o.gradient_accumulation_steps > 1) {
    const double elems = sharded_grads ? p / world : p;
    const Cost acc = other(elems, 8 * elems, 4 * elems);
    add("gradient accumulation (.grad +=)", Pass::kBackward, a - 1, acc, acc, 0, false);
  }

  // ---- Data parallelism: the device-memory side of the collectives (the interconnect's time is
  // not modelled: hardware.h has no link bandwidth). A lower bound: every gradient byte read once
  // to send or reduce, the result written once, and what arrives from the other ranks written
  // (ring: 2 (W - 1) / W of the buffer for an all-reduce, (W - 1) / W for a reduce-scatter or an
  // all-gather).
  if (o.parallel.world_size > 1) {
    const double share = (world - 1) / world;
    if (o.parallel.zero_stage < 2) {
      const Cost ar = other(p * share, 4 * p + 8 * p * share, 4 * p);
      add("gradient all-reduce", Pass::kStep, 1, ar, ar, 0, false);
    } else {
      // Each micro-batch's gradients copied into the staging buckets (R W 4P) and reduce-scattered
      // into this rank's shard.
      const Cost rs = other(p * share, 4 * p + 4 * p + 4 * p * share, 4 * p + 4 * p / world);
      add("gradient reduce-scatter (ZeRO-2)", Pass::kBackward, a, rs, rs, 0, false);
    }
    if (o.parallel.zero_stage >= 1) {
      const Cost ag = rw(4 * p / world, 4 * p * share);
      add("parameter all-gather (ZeRO)", Pass::kStep, 1, ag, ag, 0, false);
    }
  }

  // ---- Optimizer step, once per optimizer step whatever the accumulation.
  const double grad_elems = sharded_grads ? p / world : p;
  if (o.dtype == "fp16") {
    // GradScaler's unscale with its inf/NaN check (optim/grad.cpp): R W 4 per gradient.
    const Cost unscale = other(2 * grad_elems, 4 * grad_elems, 4 * grad_elems);
    add("loss-scale unscale", Pass::kStep, 1, unscale, unscale, 0, false);
  }
  if (o.clip_grad_norm) {
    // _foreach_norm R 4 per gradient, then _foreach_mul_ by the clip coefficient R W 4.
    const Cost clip = other(3 * grad_elems, 8 * grad_elems, 4 * grad_elems);
    add("gradient clipping", Pass::kStep, 1, clip, clip, 0, false);
  }
  {
    // AdamW over the fp32 parameters this rank updates. kiln: ATen's fused kernel (optim/adamw.cpp)
    // R param, grad, exp_avg, exp_avg_sq W param, exp_avg, exp_avg_sq: 28 bytes per parameter.
    // torch.optim.AdamW's foreach path: params *= 1 - lr wd (R W 4); exp_avg.lerp_(grad) (R 8 W 4);
    // exp_avg_sq *= beta2 (R W 4); addcmul_(grad, grad) (R 8 W 4); sqrt (R W 4); / bias
    // correction (R W 4); + eps (R W 4); params.addcdiv_ (R 12 W 4): 80 bytes.
    // FLOPs per parameter: decay 1, first moment 3, second 4, bias corrections 2, sqrt, eps and
    // divide 3, update 2: 15.
    const double elems = o.parallel.world_size > 1 && o.parallel.zero_stage >= 1 ? p / world : p;
    add("AdamW", Pass::kStep, 1, other(15 * elems, 16 * elems, 12 * elems), other(15 * elems, 52 * elems, 28 * elems),
        0, false);
  }

  // ---- Recomputation in backward. full / every_n: the recomputed layers run their whole forward
  // again (weight casts included: the forward's autocast cache is gone by then). selective
  // (train/recompute_layers.cpp): per layer both RMSNorms, the casts of their outputs, SwiGLU
  // and the merged attention output copy for o_proj's weight gradient. Executed work only: no
  // model FLOPs.
  if (o.recompute == "full" || o.recompute == "every_n") {
    const int every = o.recompute == "full" ? 1 : o.every;
    const double recomputed = std::ceil(layers / static_cast<double>(every)) * a;
    std::vector<TrafficRow> again;
    for (const TrafficRow& row : r.rows) {
      if (row.layer && row.pass == Pass::kForward) again.push_back(row);
    }
    for (TrafficRow row : again) {
      row.pass = Pass::kRecompute;
      row.repeats = recomputed;
      row.model_flops = 0;
      r.rows.push_back(row);
    }
  } else if (selective) {
    add("input RMSNorm", Pass::kRecompute, per_layer, norm_kiln.fwd, norm_eager.fwd, 0, true);
    add("post-attention RMSNorm", Pass::kRecompute, per_layer, norm_kiln.fwd, norm_eager.fwd, 0, true);
    const Cost cast_again = autocast ? rw(2 * 4 * n * h, 2 * c * n * h) : Cost{};
    add("autocast casts", Pass::kRecompute, per_layer, cast_again, cast_again, 0, true);
    add("SwiGLU", Pass::kRecompute, per_layer,
        k.fused_swiglu ? swiglu_fused(n * f, c).fwd : swiglu_unfused(n * f, c).fwd, swiglu_unfused(n * f, c).fwd, 0,
        true);
    const Cost merge = rw(c * n * q, c * n * q);
    add("attention output merge", Pass::kRecompute, per_layer, merge, merge, 0, true);
  }
  return r;
}

Cost TrafficReport::kiln_step() const {
  Cost total;
  for (const TrafficRow& row : rows) total += row.kiln_step();
  return total;
}

Cost TrafficReport::eager_step() const {
  Cost total;
  for (const TrafficRow& row : rows) total += row.eager_step();
  return total;
}

double TrafficReport::model_flops_step() const {
  double total = 0;
  for (const TrafficRow& row : rows) total += row.model_flops * row.repeats;
  return total;
}

Cost TrafficReport::kiln_step(const std::string& component, Pass pass) const {
  Cost total;
  for (const TrafficRow& row : rows) {
    if (row.component == component && row.pass == pass) total += row.kiln_step();
  }
  return total;
}

const TrafficRow* TrafficReport::find(const std::string& component, Pass pass) const {
  for (const TrafficRow& row : rows) {
    if (row.component == component && row.pass == pass) return &row;
  }
  return nullptr;
}

double Roofline::compute_seconds(const Cost& c) const {
  return c.gemm_flops / gemm_flops_per_s + c.other_flops / other_flops_per_s;
}

double Roofline::seconds(const Cost& c) const {
  return std::max(compute_seconds(c), memory_seconds(c));
}

Roofline roofline(const HardwareSpec& hw, const std::string& dtype) {
  Roofline r;
  r.device = hw.name;
  r.gemm_flops_per_s = hw.peak_tflops(dtype) * 1e12;
  r.other_flops_per_s = hw.fp32 * 1e12;
  r.bandwidth = hw.memory_bandwidth;
  // fp32, and bf16 on a V100 (no bf16 tensor cores) or a CPU without AMX, run their GEMMs on the
  // FP32 (vector) units.
  r.tensor_cores = hw.tensor_cores(dtype);
  return r;
}

double modelled_step_seconds(const TrafficReport& report, const Roofline& roof, bool eager) {
  double total = 0;
  for (const TrafficRow& row : report.rows) total += roof.seconds(eager ? row.eager : row.kiln) * row.repeats;
  return total;
}

ModelledUtilisation modelled_utilisation(const TrafficReport& report, const Roofline& roof, double seconds_per_step,
                                         bool eager) {
  if (!(seconds_per_step > 0)) throw std::invalid_argument("modelled_utilisation: seconds_per_step must be > 0");
  const Cost step = eager ? report.eager_step() : report.kiln_step();
  ModelledUtilisation u;
  u.memory_bandwidth = step.bytes / seconds_per_step / roof.bandwidth;
  if (roof.tensor_cores) {
    u.tensor_core = step.gemm_flops / roof.gemm_flops_per_s / seconds_per_step;
    u.fp_engine = step.other_flops / roof.other_flops_per_s / seconds_per_step;
  } else {
    // The GEMMs share the vector units with the rest, at the dtype's vector rate (a CPU's
    // AVX512_BF16 runs bf16 GEMMs at twice its fp32 rate; elsewhere the two rates are equal).
    u.fp_engine =
        (step.gemm_flops / roof.gemm_flops_per_s + step.other_flops / roof.other_flops_per_s) / seconds_per_step;
  }
  return u;
}

std::string kiln_attention_path(bool kiln_kernel_chosen, const HardwareSpec& hardware, const std::string& dtype,
                                int64_t head_dim) {
  if (!kiln_kernel_chosen || dtype == "fp32" || (head_dim != 64 && head_dim != 128)) return "sdpa";
  // Volta: fp16 only (no bf16 tensor cores), and at head_dim 128 the blocks' 144 KiB of shared
  // memory exceed the 96 KiB a V100 block may opt in to.
  if (hardware.family == "V100") return dtype == "fp16" && head_dim == 64 ? "flash" : "sdpa";
  return "flash";
}

}  // namespace kiln::cost
