// See cpu_loops.h. Built without LibTorch (CMake target kiln_cpu_loops) with -ffp-contract=off and
// -fopenmp.
#include "kiln/kernels/cpu_loops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

// Each loop body is inlined into three functions, built for x86-64-v4 (AVX-512), x86-64-v3 (AVX2)
// and the baseline; the exported function calls the one this CPU supports (or the level a test
// forced). Not GCC's target_clones: their resolvers are exported from libkiln.so whatever their
// visibility.
#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_X86_LEVELS 1
#define KILN_BODY inline __attribute__((always_inline))
#else
#define KILN_BODY inline
#endif

namespace kiln::kernels::cpu {

namespace {

constexpr int kLanes = 16;

// sum of a[j] * b[j] over [0, n): 16 fixed lanes, then the tail, then the lanes in order.
KILN_BODY float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
  }
  float s = 0.0f;
  for (; j < n; ++j) s += a[j] * b[j];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

KILN_BODY float exp_inline(float x) {
  // exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 (ln 2 in two parts), exp(r) by
  // Cephes' degree-6 polynomial.
  x = std::max(std::min(x, 88.0f), -87.33654f);  // 2^k stays a normal float; min/max, not branches
  const float k = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

KILN_BODY void rmsnorm_forward_rows_body(const float* x, const float* residual, const float* w, float* y, float* h_out,
                                         float* rstd, int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float* h = xr;
    if (residual != nullptr) {
      float* hr = h_out + r * cols;
      const float* rr = residual + r * cols;
      for (int64_t j = 0; j < cols; ++j) hr[j] = xr[j] + rr[j];
      h = hr;
    }
    const float rs = 1.0f / std::sqrt(dot(h, h, cols) / static_cast<float>(cols) + eps);
    rstd[r] = rs;
    for (int64_t j = 0; j < cols; ++j) yr[j] = w[j] * (h[j] * rs);
  }
}

KILN_BODY void rmsnorm_backward_rows_body(const float* h, const float* w, const float* rstd, const float* dy,
                                          const float* dh, float* dx, float* dw_acc, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* hr = h + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    const float rs = rstd[r];
    // mean(g n) first (one pass), then dx and dw (a second).
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) acc[l] += (dyr[j + l] * w[j + l]) * (hr[j + l] * rs);
    }
    float s = 0.0f;
    for (; j < cols; ++j) s += (dyr[j] * w[j]) * (hr[j] * rs);
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    const float m = s / static_cast<float>(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const float n = hr[c] * rs;
      dxr[c] = rs * (dyr[c] * w[c] - n * m);
      dw_acc[c] += dyr[c] * n;
    }
    if (dh != nullptr) {
      const float* dhr = dh + r * cols;
      for (int64_t c = 0; c < cols; ++c) dxr[c] += dhr[c];
    }
  }
}

KILN_BODY void swiglu_forward_range_body(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (g[i] / (1.0f + exp_inline(-g[i]))) * u[i];
}

KILN_BODY void swiglu_backward_range_body(const float* g, const float* u, const float* dy, float* dg, float* du,
                                          int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + exp_inline(-g[i]));
    const float d = dy[i];
    dg[i] = d * u[i] * s * (1.0f + g[i] * (1.0f - s));
    du[i] = d * (g[i] * s);
  }
}

KILN_BODY float from_bf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// x rounded to the nearest bf16 (ties to even), as c10::BFloat16 rounds; NaN stays a quiet NaN.
KILN_BODY uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}

KILN_BODY void swiglu_forward_bf16_range_body(const uint16_t* g, const uint16_t* u, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = from_bf16(g[i]);
    y[i] = to_bf16((gi / (1.0f + exp_inline(-gi))) * from_bf16(u[i]));
  }
}

KILN_BODY void swiglu_backward_bf16_range_body(const uint16_t* g, const uint16_t* u, const uint16_t* dy, uint16_t* dg,
                                               uint16_t* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = from_bf16(g[i]), ui = from_bf16(u[i]), d = from_bf16(dy[i]);
    const float s = 1.0f / (1.0f + exp_inline(-gi));
    dg[i] = to_bf16(d * ui * s * (1.0f + gi * (1.0f - s)));
    du[i] = to_bf16(d * (gi * s));
  }
}

// Elements of the cross-entropy rows: fp32 as is, bf16 (uint16 bits) widened on load and rounded
// once on store.
KILN_BODY float load_elem(float x) {
  return x;
}
KILN_BODY float load_elem(uint16_t x) {
  return from_bf16(x);
}
KILN_BODY void store_elem(float* p, float v) {
  *p = v;
}
KILN_BODY void store_elem(uint16_t* p, float v) {
  *p = to_bf16(v);
}

// A value rounded as an op producing T rounds it (fp32: as is).
KILN_BODY float round_elem(float v, const float*) {
  return v;
}
KILN_BODY float round_elem(float v, const uint16_t*) {
  return from_bf16(to_bf16(v));
}

// n (<= 16) pairs of a RoPE row from index j of each half: both halves read before either is
// written (x may be y). S, C, D: the element types of x, the tables and y; each product and the
// sum are rounded to D (an op producing D rounds there).
template <typename S, typename C, typename D>
KILN_BODY void rope_lanes(const S* x, D* y, const C* c, const C* s, int64_t half, int64_t j, int64_t n, int backward) {
  const D* tag = nullptr;
  float x1[kLanes], x2[kLanes], y1[kLanes], y2[kLanes];
  for (int64_t l = 0; l < n; ++l) {
    x1[l] = load_elem(x[j + l]);
    x2[l] = load_elem(x[half + j + l]);
  }
  if (backward == 0) {
    for (int64_t l = 0; l < n; ++l) {
      y1[l] = round_elem(x1[l] * load_elem(c[j + l]), tag) - round_elem(x2[l] * load_elem(s[j + l]), tag);
      y2[l] = round_elem(x2[l] * load_elem(c[half + j + l]), tag) + round_elem(x1[l] * load_elem(s[half + j + l]), tag);
    }
  } else {
    for (int64_t l = 0; l < n; ++l) {
      y1[l] = round_elem(x1[l] * load_elem(c[j + l]), tag) + round_elem(x2[l] * load_elem(s[half + j + l]), tag);
      y2[l] = round_elem(x2[l] * load_elem(c[half + j + l]), tag) - round_elem(x1[l] * load_elem(s[j + l]), tag);
    }
  }
  for (int64_t l = 0; l < n; ++l) {
    store_elem(y + j + l, y1[l]);
    store_elem(y + half + j + l, y2[l]);
  }
}

// RoPE over rows [r0, r1) of the B*H*T rows (cpu_loops.h): rows of D contiguous elements.
template <typename S, typename C, typename D>
KILN_BODY void rope_rows_core(const S* src, D* dst, const C* cos, const C* sin, const RopeShape& sh, int64_t r0,
                              int64_t r1, int backward) {
  const int64_t half = sh.dim / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = r % sh.seq, h = (r / sh.seq) % sh.heads, b = r / (sh.seq * sh.heads);
    const S* x = src + b * sh.src_stride[0] + h * sh.src_stride[1] + t * sh.src_stride[2];
    D* y = dst + b * sh.dst_stride[0] + h * sh.dst_stride[1] + t * sh.dst_stride[2];
    const C* c = cos + b * sh.cs_batch_stride + t * sh.dim;
    const C* s = sin + b * sh.cs_batch_stride + t * sh.dim;
    int64_t j = 0;
    for (; j + kLanes <= half; j += kLanes) rope_lanes(x, y, c, s, half, j, kLanes, backward);
    if (j < half) rope_lanes(x, y, c, s, half, j, half - j, backward);
  }
}

KILN_BODY void rope_rows_body(const float* src, float* dst, const float* cos, const float* sin, const RopeShape* sh,
                              int64_t r0, int64_t r1, int backward) {
  rope_rows_core(src, dst, cos, sin, *sh, r0, r1, backward);
}

KILN_BODY void rope_rows_bf16_body(const uint16_t* src, uint16_t* dst, const uint16_t* cos, const uint16_t* sin,
                                   const RopeShape* sh, int64_t r0, int64_t r1, int backward) {
  rope_rows_core(src, dst, cos, sin, *sh, r0, r1, backward);
}

KILN_BODY void rope_rows_bf16_fp32_body(const uint16_t* src, float* dst, const float* cos, const float* sin,
                                        const RopeShape* sh, int64_t r0, int64_t r1) {
  rope_rows_core(src, dst, cos, sin, *sh, r0, r1, 0);
}

KILN_BODY void rope_rows_fp32_bf16_body(const float* src, uint16_t* dst, const float* cos, const float* sin,
                                        const RopeShape* sh, int64_t r0, int64_t r1) {
  rope_rows_core(src, dst, cos, sin, *sh, r0, r1, 1);
}

// The rows in fp32 arithmetic whatever T; the gradient written over the row in T.
template <typename T>
KILN_BODY void cross_entropy_rows_core(T* logits, const int64_t* labels, int64_t ignore_index, float z_loss,
                                       float* loss, float* lse, int64_t rows, int64_t cols, int write_grad,
                                       float grad_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    T* x = logits + r * cols;
    // Pass 1: the row's maximum (a NaN wins, so that it reaches the loss).
    float lane[kLanes];
    for (int l = 0; l < kLanes; ++l) lane[l] = -INFINITY;
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const float v = load_elem(x[j + l]);
        lane[l] = lane[l] > v ? lane[l] : v;
      }
    }
    float m = -INFINITY;
    for (; j < cols; ++j) {
      const float v = load_elem(x[j]);
      m = m > v ? m : v;
    }
    for (int l = 0; l < kLanes; ++l) m = m > lane[l] ? m : lane[l];
    // Pass 2: sum of exp(x - m), 16 fixed lanes.
    for (int l = 0; l < kLanes; ++l) lane[l] = 0.0f;
    j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) lane[l] += exp_inline(load_elem(x[j + l]) - m);
    }
    float s = 0.0f;
    for (; j < cols; ++j) s += exp_inline(load_elem(x[j]) - m);
    for (int l = 0; l < kLanes; ++l) s += lane[l];
    // log in double, then rounded: the correctly rounded float on any libm.
    const float logs = static_cast<float>(std::log(static_cast<double>(s)));
    const int64_t t = labels[r];
    const bool valid = t != ignore_index;
    const float xt = load_elem(x[valid ? t : 0]);
    const float nll = logs - (xt - m);
    const float l_se = xt + nll;
    lse[r] = l_se;
    loss[r] = valid ? nll + z_loss * (l_se * l_se) : 0.0f;
    if (write_grad == 0) continue;
    // Pass 3: the gradient, in place.
    if (!valid) {
      for (int64_t c = 0; c < cols; ++c) store_elem(x + c, 0.0f);
      continue;
    }
    // Times grad_scale before the store rounds (x * 1 is x: without a scale, the same bits).
    const float scale = 1.0f + 2.0f * z_loss * l_se;
    for (int64_t c = 0; c < cols; ++c) {
      store_elem(x + c, (exp_inline((load_elem(x[c]) - m) - logs) * scale) * grad_scale);
    }
    // The target's element from its own value (in bf16 the stored softmax is already rounded).
    store_elem(x + t, (exp_inline((xt - m) - logs) * scale - 1.0f) * grad_scale);
  }
}

KILN_BODY void cross_entropy_rows_lv_body(float* logits, const int64_t* labels, int64_t ignore_index, float z_loss,
                                          float* loss, float* lse, int64_t rows, int64_t cols, int write_grad,
                                          float grad_scale) {
  cross_entropy_rows_core(logits, labels, ignore_index, z_loss, loss, lse, rows, cols, write_grad, grad_scale);
}

KILN_BODY void cross_entropy_rows_bf16_lv_body(uint16_t* logits, const int64_t* labels, int64_t ignore_index,
                                               float z_loss, float* loss, float* lse, int64_t rows, int64_t cols,
                                               int write_grad, float grad_scale) {
  cross_entropy_rows_core(logits, labels, ignore_index, z_loss, loss, lse, rows, cols, write_grad, grad_scale);
}

// acc += widened src.
KILN_BODY void accumulate_bf16_range_body(float* acc, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += from_bf16(src[i]);
}

// x rounded to the nearest bf16 and widened back (to_bf16 above).
KILN_BODY void round_bf16_range_body(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_bf16(to_bf16(in[i]));
}

// x rounded to the nearest fp16 (ties to even, overflow to infinity, subnormals), through the
// compiler's _Float16.
KILN_BODY void round_fp16_range_body(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<_Float16>(in[i]));
}

std::atomic<int> forced_level{0};

int detected_level() {
#ifdef KILN_X86_LEVELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd")) {
    return 4;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2")) return 3;
#endif
  return 1;
}

}  // namespace

int isa_level() {
  static const int detected = detected_level();
  const int forced = forced_level.load();
  return forced > 0 ? std::min(forced, detected) : detected;
}

void testing::force_isa_level(int level) {
  forced_level = level;
}

float exp_approx(float x) {
  return x < -87.33654f ? 0.0f : exp_inline(x);  // (the loops keep the tiny value: 1 + it is 1)
}

// One function per loop body: the body built three times, then a switch on the level.
#ifdef KILN_X86_LEVELS
#define KILN_LEVELS(name, params, args)                             \
  namespace {                                                       \
  __attribute__((target("arch=x86-64-v4"))) void name##_v4 params { \
    name##_body args;                                               \
  }                                                                 \
  __attribute__((target("arch=x86-64-v3"))) void name##_v3 params { \
    name##_body args;                                               \
  }                                                                 \
  void name##_v1 params {                                           \
    name##_body args;                                               \
  }                                                                 \
  }                                                                 \
  void name params {                                                \
    const int level = isa_level();                                  \
    if (level >= 4) return name##_v4 args;                          \
    if (level == 3) return name##_v3 args;                          \
    return name##_v1 args;                                          \
  }
#else
#define KILN_LEVELS(name, params, args) \
  void name params {                    \
    name##_body args;                   \
  }
#endif

// The level-dispatched bodies on one thread's share (internal names, declared here).
void rmsnorm_forward_rows(const float* x, const float* residual, const float* w, float* y, float* h_out, float* rstd,
                          int64_t rows, int64_t cols, float eps);
void rmsnorm_backward_rows(const float* h, const float* w, const float* rstd, const float* dy, const float* dh,
                           float* dx, float* dw_acc, int64_t rows, int64_t cols);
void swiglu_forward_range(const float* g, const float* u, float* y, int64_t n);
void swiglu_backward_range(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n);
void swiglu_forward_bf16_range(const uint16_t* g, const uint16_t* u, uint16_t* y, int64_t n);
void swiglu_backward_bf16_range(const uint16_t* g, const uint16_t* u, const uint16_t* dy, uint16_t* dg, uint16_t* du,
                                int64_t n);
void cross_entropy_rows_lv(float* logits, const int64_t* labels, int64_t ignore_index, float z_loss, float* loss,
                           float* lse, int64_t rows, int64_t cols, int write_grad, float grad_scale);
void cross_entropy_rows_bf16_lv(uint16_t* logits, const int64_t* labels, int64_t ignore_index, float z_loss,
                                float* loss, float* lse, int64_t rows, int64_t cols, int write_grad, float grad_scale);
void accumulate_bf16_range(float* acc, const uint16_t* src, int64_t n);
void rope_rows(const float* src, float* dst, const float* cos, const float* sin, const RopeShape* sh, int64_t r0,
               int64_t r1, int backward);
void rope_rows_bf16(const uint16_t* src, uint16_t* dst, const uint16_t* cos, const uint16_t* sin, const RopeShape* sh,
                    int64_t r0, int64_t r1, int backward);
void rope_rows_bf16_fp32(const uint16_t* src, float* dst, const float* cos, const float* sin, const RopeShape* sh,
                         int64_t r0, int64_t r1);
void rope_rows_fp32_bf16(const float* src, uint16_t* dst, const float* cos, const float* sin, const RopeShape* sh,
                         int64_t r0, int64_t r1);
void round_bf16_range(const float* in, float* out, int64_t n);
void round_fp16_range(const float* in, float* out, int64_t n);

KILN_LEVELS(rmsnorm_forward_rows,
            (const float* x, const float* residual, const float* w, float* y, float* h_out, float* rstd, int64_t rows,
             int64_t cols, float eps),
            (x, residual, w, y, h_out, rstd, rows, cols, eps))
KILN_LEVELS(rmsnorm_backward_rows,
            (const float* h, const float* w, const float* rstd, const float* dy, const float* dh, float* dx,
             float* dw_acc, int64_t rows, int64_t cols),
            (h, w, rstd, dy, dh, dx, dw_acc, rows, cols))
KILN_LEVELS(swiglu_forward_range, (const float* g, const float* u, float* y, int64_t n), (g, u, y, n))
KILN_LEVELS(swiglu_backward_range, (const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n),
            (g, u, dy, dg, du, n))
KILN_LEVELS(swiglu_forward_bf16_range, (const uint16_t* g, const uint16_t* u, uint16_t* y, int64_t n), (g, u, y, n))
KILN_LEVELS(swiglu_backward_bf16_range,
            (const uint16_t* g, const uint16_t* u, const uint16_t* dy, uint16_t* dg, uint16_t* du, int64_t n),
            (g, u, dy, dg, du, n))
KILN_LEVELS(cross_entropy_rows_lv,
            (float* logits, const int64_t* labels, int64_t ignore_index, float z_loss, float* loss, float* lse,
             int64_t rows, int64_t cols, int write_grad, float grad_scale),
            (logits, labels, ignore_index, z_loss, loss, lse, rows, cols, write_grad, grad_scale))
KILN_LEVELS(cross_entropy_rows_bf16_lv,
            (uint16_t * logits, const int64_t* labels, int64_t ignore_index, float z_loss, float* loss, float* lse,
             int64_t rows, int64_t cols, int write_grad, float grad_scale),
            (logits, labels, ignore_index, z_loss, loss, lse, rows, cols, write_grad, grad_scale))
KILN_LEVELS(rope_rows,
            (const float* src, float* dst, const float* cos, const float* sin, const RopeShape* sh, int64_t r0,
             int64_t r1, int backward),
            (src, dst, cos, sin, sh, r0, r1, backward))
KILN_LEVELS(rope_rows_bf16,
            (const uint16_t* src, uint16_t* dst, const uint16_t* cos, const uint16_t* sin, const RopeShape* sh,
             int64_t r0, int64_t r1, int backward),
            (src, dst, cos, sin, sh, r0, r1, backward))
KILN_LEVELS(rope_rows_bf16_fp32,
            (const uint16_t* src, float* dst, const float* cos, const float* sin, const RopeShape* sh, int64_t r0,
             int64_t r1),
            (src, dst, cos, sin, sh, r0, r1))
KILN_LEVELS(rope_rows_fp32_bf16,
            (const float* src, uint16_t* dst, const float* cos, const float* sin, const RopeShape* sh, int64_t r0,
             int64_t r1),
            (src, dst, cos, sin, sh, r0, r1))
KILN_LEVELS(accumulate_bf16_range, (float* acc, const uint16_t* src, int64_t n), (acc, src, n))
KILN_LEVELS(round_bf16_range, (const float* in, float* out, int64_t n), (in, out, n))
KILN_LEVELS(round_fp16_range, (const float* in, float* out, int64_t n), (in, out, n))

// ---- The exported functions: OpenMP over fixed shares (the runtime LibTorch uses, so its thread
// count applies; LibTorch's at::parallel_for is an inline OpenMP region that only a TU compiled
// with -fopenmp runs in parallel, hence the loops' own).

namespace {
constexpr int64_t kGrain = int64_t{1} << 14;  // elements per share of an element-wise loop

// Runs fn(begin, end) over [0, n) in shares of `grain`, in parallel when there are several.
template <typename Fn>
void parallel_ranges(int64_t n, int64_t grain, const Fn& fn) {
  const int64_t shares = (n + grain - 1) / grain;
#pragma omp parallel for schedule(static) if (shares > 1)
  for (int64_t k = 0; k < shares; ++k) fn(k * grain, std::min(n, (k + 1) * grain));
}
}  // namespace

void rmsnorm_forward(const float* x, const float* residual, const float* w, float* y, float* h_out, float* rstd,
                     int64_t rows, int64_t cols, float eps) {
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
  parallel_ranges(rows, grain, [&](int64_t b, int64_t e) {
    rmsnorm_forward_rows(x + b * cols, residual ? residual + b * cols : nullptr, w, y + b * cols,
                         h_out ? h_out + b * cols : nullptr, rstd + b, e - b, cols, eps);
  });
}

void rmsnorm_backward(const float* h, const float* w, const float* rstd, const float* dy, const float* dh, float* dx,
                      float* dw_acc, int64_t rows, int64_t cols) {
  // Fixed blocks of about 64K elements (not one per thread), each with its own partial weight
  // gradient, added in block order: the result does not depend on the thread count.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1));
  const int64_t blocks = (rows + block - 1) / block;
  std::vector<float> partial(static_cast<size_t>(blocks * cols), 0.0f);
  parallel_ranges(blocks, 1, [&](int64_t b, int64_t) {
    const int64_t r0 = b * block, nr = std::min(block, rows - r0);
    rmsnorm_backward_rows(h + r0 * cols, w, rstd + r0, dy + r0 * cols, dh ? dh + r0 * cols : nullptr, dx + r0 * cols,
                          partial.data() + b * cols, nr, cols);
  });
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t c = 0; c < cols; ++c) dw_acc[c] += partial[static_cast<size_t>(b * cols + c)];
  }
}

void swiglu_forward(const float* g, const float* u, float* y, int64_t n) {
  parallel_ranges(n, kGrain, [&](int64_t b, int64_t e) { swiglu_forward_range(g + b, u + b, y + b, e - b); });
}

void swiglu_backward(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) {
  parallel_ranges(n, kGrain,
                  [&](int64_t b, int64_t e) { swiglu_backward_range(g + b, u + b, dy + b, dg + b, du + b, e - b); });
}

void swiglu_forward_bf16(const uint16_t* g, const uint16_t* u, uint16_t* y, int64_t n) {
  parallel_ranges(n, kGrain, [&](int64_t b, int64_t e) { swiglu_forward_bf16_range(g + b, u + b, y + b, e - b); });
}

void swiglu_backward_bf16(const uint16_t* g, const uint16_t* u, const uint16_t* dy, uint16_t* dg, uint16_t* du,
                          int64_t n) {
  parallel_ranges(n, kGrain, [&](int64_t b, int64_t e) {
    swiglu_backward_bf16_range(g + b, u + b, dy + b, dg + b, du + b, e - b);
  });
}

namespace {
// The rows over OpenMP shares of whole rows, for either element type's level-dispatched loop.
template <typename T>
void cross_entropy_rows_parallel(void (*rows_lv)(T*, const int64_t*, int64_t, float, float*, float*, int64_t, int64_t,
                                                 int, float),
                                 T* logits, const int64_t* labels, int64_t ignore_index, float z_loss, float* loss,
                                 float* lse, int64_t rows, int64_t cols, bool write_grad, float grad_scale) {
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
  parallel_ranges(rows, grain, [&](int64_t b, int64_t e) {
    rows_lv(logits + b * cols, labels + b, ignore_index, z_loss, loss + b, lse + b, e - b, cols, write_grad ? 1 : 0,
            grad_scale);
  });
}
}  // namespace

void cross_entropy_rows(float* logits, const int64_t* labels, int64_t ignore_index, float z_loss, float* loss,
                        float* lse, int64_t rows, int64_t cols, bool write_grad, float grad_scale) {
  cross_entropy_rows_parallel(&cross_entropy_rows_lv, logits, labels, ignore_index, z_loss, loss, lse, rows, cols,
                              write_grad, grad_scale);
}

void cross_entropy_rows_bf16(uint16_t* logits, const int64_t* labels, int64_t ignore_index, float z_loss, float* loss,
                             float* lse, int64_t rows, int64_t cols, bool write_grad, float grad_scale) {
  cross_entropy_rows_parallel(&cross_entropy_rows_bf16_lv, logits, labels, ignore_index, z_loss, loss, lse, rows, cols,
                              write_grad, grad_scale);
}

namespace {
// fn(begin, end) over the B*H*T rows of a RoPE call, in shares of about kGrain elements.
template <typename Fn>
void rope_row_shares(const RopeShape& shape, const Fn& fn) {
  parallel_ranges(shape.batch * shape.heads * shape.seq, std::max<int64_t>(1, kGrain / std::max<int64_t>(shape.dim, 1)),
                  fn);
}
}  // namespace

void rope(const float* src, float* dst, const float* cos, const float* sin, const RopeShape& shape, bool backward) {
  rope_row_shares(shape, [&](int64_t b, int64_t e) { rope_rows(src, dst, cos, sin, &shape, b, e, backward ? 1 : 0); });
}

void rope_bf16(const uint16_t* src, uint16_t* dst, const uint16_t* cos, const uint16_t* sin, const RopeShape& shape,
               bool backward) {
  rope_row_shares(shape,
                  [&](int64_t b, int64_t e) { rope_rows_bf16(src, dst, cos, sin, &shape, b, e, backward ? 1 : 0); });
}

void rope_bf16_to_fp32(const uint16_t* src, float* dst, const float* cos, const float* sin, const RopeShape& shape) {
  rope_row_shares(shape, [&](int64_t b, int64_t e) { rope_rows_bf16_fp32(src, dst, cos, sin, &shape, b, e); });
}

void rope_backward_fp32_to_bf16(const float* src, uint16_t* dst, const float* cos, const float* sin,
                                const RopeShape& shape) {
  rope_row_shares(shape, [&](int64_t b, int64_t e) { rope_rows_fp32_bf16(src, dst, cos, sin, &shape, b, e); });
}

void accumulate_bf16(float* acc, const uint16_t* src, int64_t n) {
  parallel_ranges(n, kGrain, [&](int64_t b, int64_t e) { accumulate_bf16_range(acc + b, src + b, e - b); });
}

void round_to_bf16(const float* in, float* out, int64_t n) {
  parallel_ranges(n, kGrain, [&](int64_t b, int64_t e) { round_bf16_range(in + b, out + b, e - b); });
}

void round_to_fp16(const float* in, float* out, int64_t n) {
  parallel_ranges(n, kGrain, [&](int64_t b, int64_t e) { round_fp16_range(in + b, out + b, e - b); });
}

}  // namespace kiln::kernels::cpu
