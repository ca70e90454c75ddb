// kiln's CUDA kernels (lib/kiln/kernels/*.cu) compiled as host C++ against the CUDA emulation
// (lib/kiln/kernels/emulation.h), every variant the launchers can pick, each under several
// schedules and both cp.async landings, against plain fp64 loops over the same rounded inputs.
// No LibTorch: the same sources also build with ThreadSanitizer (kiln_kernel_tests_tsan), with
// AddressSanitizer + UBSan (scripts/test.sh --sanitize), and scripts/check_kernel_mutants.py
// rebuilds them once per mutant. The ATen-based emulated tests (tests/ops/*_emulated.cpp) hold
// the same kernels to the ops' own semantics.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/emulated.h"
#include "kiln/kernels/emulation.h"

namespace kk = kiln::kernels;
namespace emu = kiln::emu;

namespace {

using bf16 = __nv_bfloat16;
using fp16 = __half;

template <typename T>
float f(T v) {
  return static_cast<float>(v);
}
template <typename T>
T cast(float v) {
  return static_cast<T>(v);
}
template <typename T>
kk::DType dtype_of() {
  return std::is_same_v<T, bf16>   ? kk::DType::kBFloat16
         : std::is_same_v<T, fp16> ? kk::DType::kFloat16
                                   : kk::DType::kFloat32;
}
template <typename T>
const char* name_of() {
  return std::is_same_v<T, bf16> ? "bf16" : std::is_same_v<T, fp16> ? "fp16" : "fp32";
}
// One rounding of the dtype, relative: fp32 2^-24, fp16 2^-11, bf16 2^-8.
template <typename T>
double unit() {
  return std::is_same_v<T, bf16> ? 1.0 / 256 : std::is_same_v<T, fp16> ? 1.0 / 2048 : 1.0 / (1 << 24);
}

std::mt19937& rng() {
  static std::mt19937 g(20261205);
  return g;
}
template <typename T>
std::vector<T> randn(size_t n, double scale = 1.0, double shift = 0.0) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = cast<T>(static_cast<float>(d(rng()) * scale + shift));
  return v;
}

// Every element within tol * (1 + |ref|) (NaN fails); the worst one described otherwise.
template <typename G>
std::string mismatch(const char* what, const G& got, const std::vector<double>& ref, double tol) {
  size_t bad = 0, worst = 0;
  double worst_err = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(f(got[i])) - ref[i]);
    if (!(err <= tol * (1 + std::fabs(ref[i])))) {
      ++bad;
      if (!(err <= worst_err)) worst_err = err, worst = i;
    }
  }
  if (bad == 0) return "";
  std::ostringstream s;
  s << what << ": " << bad << " of " << ref.size() << " elements off, e.g. [" << worst << "] " << f(got[worst])
    << " vs " << ref[worst];
  return s.str();
}
#define CHECK_CLOSE(what, got, ref, tol) CHECK(mismatch(what, got, ref, tol) == "")

// The schedules every case runs under: each order and both cp.async landings (a few here; the
// [slow] case adds many random seeds).
std::vector<emu::Config> schedules(int arch, bool many) {
  using S = emu::Schedule;
  using L = emu::Landing;
  std::vector<emu::Config> v = {{S::kIndex, L::kAtWait, 1, arch},
                                {S::kReverse, L::kAtIssue, 2, arch},
                                {S::kRandom, L::kAtWait, 3, arch},
                                {S::kWarpAhead, L::kAtIssue, 4, arch}};
  if (many) {
    for (uint64_t seed = 5; seed < 37; ++seed)
      v.push_back({S::kRandom, seed % 2 ? L::kAtIssue : L::kAtWait, seed, arch});
  }
#ifdef KILN_EMU_TSAN
  // ThreadSanitizer's happens-before does not depend on the order fibers run in, but on when a
  // copy lands: one schedule, both landings.
  if (!many) v.resize(2);
#endif
  return v;
}

template <typename Fn>
void under_schedules(int arch, bool many, Fn&& fn) {
  for (const emu::Config& c : schedules(arch, many)) {
    CAPTURE(emu::schedule_name(c.schedule), c.seed,
            c.landing == emu::Landing::kAtIssue ? "cp.async at issue" : "at wait");
    const emu::ConfigScope scope(c);
    fn();
  }
}

// ---- RMSNorm

// blocks: the backward's grid; 0 takes the launcher's own (rmsnorm_bwd_blocks) for a 2-SM device.
template <typename T>
void rmsnorm_case(int64_t rows, int64_t cols, bool residual, bool dh, bool many, int blocks = 0) {
  CAPTURE(name_of<T>(), rows, cols, residual, dh, blocks);
  const auto x = randn<T>(rows * cols), res = randn<T>(rows * cols), dy = randn<T>(rows * cols),
             dhv = randn<T>(rows * cols);
  const auto w = randn<T>(cols, 0.3, 1.0);
  const float eps = 1e-5f;
  // Reference: h = T(x + residual) (the dtype's own add), y = w * T(h * rstd), in fp64 otherwise.
  std::vector<double> h_ref(rows * cols), y_ref(rows * cols), dx_ref(rows * cols), dw_ref(cols, 0.0);
  std::vector<float> rstd_ref(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      h_ref[i] = residual ? f(cast<T>(f(x[i]) + f(res[i]))) : f(x[i]);
      ss += h_ref[i] * h_ref[i];
    }
    const double rstd = 1.0 / std::sqrt(ss / cols + eps);
    rstd_ref[r] = static_cast<float>(rstd);
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      y_ref[i] = f(w[c]) * h_ref[i] * rstd;
      dot += f(dy[i]) * f(w[c]) * h_ref[i] * rstd_ref[r];
    }
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      const double n = h_ref[i] * rstd_ref[r];
      dx_ref[i] = rstd_ref[r] * (f(dy[i]) * f(w[c]) - n * dot / cols) + (dh ? f(dhv[i]) : 0.0);
      dw_ref[c] += f(dy[i]) * f(cast<T>(static_cast<float>(n)));
    }
  }
  under_schedules(90, many, [&] {
    std::vector<T> y(rows * cols), h(rows * cols), dx(rows * cols);
    std::vector<float> rstd(rows);
    kk::RmsNormFwdParams p;
    p.x = x.data();
    p.residual = residual ? res.data() : nullptr;
    p.weight = w.data();
    p.y = y.data();
    p.h = residual ? h.data() : nullptr;
    p.rstd = rstd.data();
    p.rows = rows;
    p.cols = cols;
    p.x_row_stride = cols;
    p.eps = eps;
    p.dtype = dtype_of<T>();
    kk::emulated::launch_rmsnorm_fwd(p, nullptr);
    // The variant the launcher picked, by its grid: a register variant (rows of R threads x 4
    // packs, R the smallest power of two from 32 that holds the row, max(1, 256 / R) rows per
    // block) up to 4096 packs, else a block per row.
    const int64_t pack = 16 / sizeof(T), packs = cols / pack;
    int64_t row_threads = 32;
    while (row_threads * 4 < packs) row_threads *= 2;
    const int64_t rows_per_block = cols % pack == 0 && packs <= 4096 ? std::max<int64_t>(1, 256 / row_threads) : 1;
    CHECK(emu::last_launch().blocks == static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
    CHECK_CLOSE("y", y, y_ref, 2 * unit<T>() + 1e-6);
    CHECK_CLOSE("rstd", rstd, std::vector<double>(rstd_ref.begin(), rstd_ref.end()), 1e-5);
    if (residual) CHECK_CLOSE("h", h, h_ref, 0.0);

    std::vector<T> hin(rows * cols);
    for (size_t i = 0; i < hin.size(); ++i) hin[i] = cast<T>(static_cast<float>(h_ref[i]));
    kk::RmsNormBwdParams b;
    b.x = hin.data();
    b.weight = w.data();
    b.dy = dy.data();
    b.dh = dh ? dhv.data() : nullptr;
    b.rstd = rstd_ref.data();
    b.dx = dx.data();
    b.rows = rows;
    b.cols = cols;
    b.dtype = dtype_of<T>();
    b.blocks = blocks > 0 ? blocks : kk::emulated::rmsnorm_bwd_blocks(b, 2);
    CHECK(b.blocks >= 1);
    CHECK(b.blocks <= rows);
    // Several blocks over the rows: grid-stride rows and partial dweight sums.
    std::vector<float> partial(b.blocks * cols);
    b.dweight_partial = partial.data();
    kk::emulated::launch_rmsnorm_bwd(b, nullptr);
    // Register variants up to 1024 packs (no dynamic shared memory), else the generic kernel.
    const bool registers = cols % pack == 0 && packs <= 1024;
    CHECK(kk::emulated::rmsnorm_bwd_uses_registers(b) == registers);
    CHECK(emu::last_launch().dynamic_smem_bytes == (registers ? 0 : cols * sizeof(float)));
    std::vector<double> dw(cols, 0.0);
    for (int k = 0; k < b.blocks; ++k) {
      for (int64_t c = 0; c < cols; ++c) dw[c] += partial[k * cols + c];
    }
    CHECK_CLOSE("dx", dx, dx_ref, 4 * unit<T>() + 1e-5);
    CHECK_CLOSE("dweight", dw, dw_ref, 1e-5);
  });
}

// ---- RoPE (in place, and autocast's mixed form)

// q and k of one launch: [B, T, H * D + pad] storage viewed as [B, H, T, D] (the projections'
// layout; an odd pad makes the token stride unaligned), rotated in place or into a contiguous
// [B, H, T, D] dst.
struct RopeShape {
  int64_t b, t, nq, nk, d, pad;
};

template <typename T>
void rope_case(const RopeShape& s, bool backward, bool table_batched, bool in_place, bool vectorized,
               int64_t narrow_limit, bool many) {
  CAPTURE(name_of<T>(), s.b, s.t, s.nq, s.nk, s.d, s.pad, backward, table_batched, in_place, vectorized, narrow_limit);
  const int64_t b = s.b, t = s.t, d = s.d, half = d / 2, tb = table_batched ? b : 1;
  std::vector<T> cs(tb * t * d), sn(tb * t * d);
  std::uniform_real_distribution<float> ang(0.f, 6.f);
  for (size_t i = 0; i < cs.size(); ++i) {
    const float a = ang(rng());
    cs[i] = cast<T>(std::cos(a));
    sn[i] = cast<T>(std::sin(a));
  }
  struct Side {
    int64_t heads, row;  // row: a token's elements in the source storage
    std::vector<T> base;
    std::vector<double> want;  // of dst: the source storage in place, else contiguous [B, H, T, D]
  };
  std::vector<Side> sides;
  for (int64_t heads : {s.nq, s.nk}) {
    if (heads == 0) continue;
    Side x{heads, heads * d + s.pad, {}, {}};
    x.base = randn<T>(b * t * x.row);  // exactly the storage, so ASan sees a read or write past it
    x.want.assign(in_place ? x.base.size() : b * heads * t * d, 0.0);
    if (in_place) {
      for (size_t i = 0; i < x.base.size(); ++i) x.want[i] = f(x.base[i]);  // the pad stays as it was
    }
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t hi = 0; hi < heads; ++hi) {
        for (int64_t ti = 0; ti < t; ++ti) {
          const int64_t src = (bi * t + ti) * x.row + hi * d, dst = in_place ? src : ((bi * heads + hi) * t + ti) * d;
          const int64_t tab = ((table_batched ? bi : 0) * t + ti) * d;
          for (int64_t i = 0; i < half; ++i) {
            const double x1 = f(x.base[src + i]), x2 = f(x.base[src + i + half]);
            const double c1 = f(cs[tab + i]), c2 = f(cs[tab + i + half]), s1 = f(sn[tab + i]),
                         s2 = f(sn[tab + i + half]);
            x.want[dst + i] = backward ? x1 * c1 + x2 * s2 : x1 * c1 - x2 * s1;
            x.want[dst + i + half] = backward ? x2 * c2 - x1 * s1 : x2 * c2 + x1 * s2;
          }
        }
      }
    }
    sides.push_back(std::move(x));
  }
  under_schedules(90, many, [&] {
    std::vector<std::vector<T>> src(sides.size()), dst(sides.size());
    kk::RopeParams p;
    for (size_t k = 0; k < sides.size(); ++k) {
      const Side& x = sides[k];
      src[k] = x.base;
      if (!in_place) dst[k].assign(x.want.size(), cast<T>(NAN));
      kk::RopeTensor& r = k == 0 ? p.q : p.k;
      r = kk::rope_in_place(src[k].data(), x.heads, t * x.row, d, x.row);
      if (!in_place) {
        r.dst = dst[k].data();
        r.dst_stride[0] = x.heads * t * d;
        r.dst_stride[1] = t * d;
        r.dst_stride[2] = d;
      }
    }
    p.cos = cs.data();
    p.sin = sn.data();
    p.batch = b;
    p.seq = t;
    p.dim = d;
    p.table_batched = table_batched;
    p.backward = backward;
    p.dtype = dtype_of<T>();
    p.narrow_index_limit = narrow_limit;
    p.vectorized = vectorized;
    kk::emulated::launch_rope(p, nullptr);
    for (size_t k = 0; k < sides.size(); ++k) {
      CAPTURE(k);
      CHECK_CLOSE("rotated", in_place ? src[k] : dst[k], sides[k].want, 3 * unit<T>() + 1e-6);
      if (!in_place)
        CHECK(std::equal(src[k].begin(), src[k].end(), sides[k].base.begin(), [](T a, T c) { return f(a) == f(c); }));
    }
  });
}

// Every shape class of the in-place kernel for one dtype: GQA at head dims 64 and 128, small and
// odd head counts, a column count that leaves lanes idle (D 48: 3 columns, 21 heads a pass), more
// columns than a token's threads (D 1056), and the scalar fallback's shapes (D 6; an odd token
// stride), each forward and backward, with an odd token count (a partial last block).
template <typename T>
void rope_cases(bool many) {
  const RopeShape gqa128{1, 3, 32, 8, 128, 0}, gqa64{2, 5, 32, 8, 64, 0}, small{2, 7, 3, 1, 16, 0},
      idle{1, 3, 20, 5, 48, 0}, wide{1, 3, 2, 1, 1056, 0}, d6{2, 5, 3, 2, 6, 0}, unaligned{2, 5, 3, 2, 16, 1},
      q_only{2, 3, 5, 0, 64, 0};
  for (bool backward : {false, true}) {
    rope_case<T>(gqa128, backward, false, true, true, int64_t{1} << 30, many);
    rope_case<T>(gqa64, backward, true, !backward, true, int64_t{1} << 30, many);
    rope_case<T>(small, backward, true, true, true, int64_t{1} << 30, many);
    rope_case<T>(idle, backward, false, true, true, int64_t{1} << 30, many);
    rope_case<T>(wide, backward, true, backward, true, int64_t{1} << 30, many);
    rope_case<T>(q_only, backward, false, true, true, int64_t{1} << 30, many);
    // The scalar kernel: shapes the 128-bit one cannot take, and one it could (32- and 64-bit index).
    rope_case<T>(d6, backward, true, true, true, int64_t{1} << 30, many);
    rope_case<T>(unaligned, backward, false, !backward, true, int64_t{1} << 30, many);
    for (int64_t limit : {int64_t{1} << 30, int64_t{0}}) rope_case<T>(small, backward, true, true, false, limit, many);
  }
}

template <typename T>
void rope_mixed_case(int64_t heads, int64_t d, bool backward, bool vectorized, int64_t narrow_limit, bool many) {
  CAPTURE(name_of<T>(), heads, d, backward, vectorized, narrow_limit);
  const int64_t b = 2, t = 7, half = d / 2;
  const size_t n = b * heads * t * d;
  std::vector<float> cs(b * t * d), sn(b * t * d);
  std::uniform_real_distribution<float> ang(0.f, 100.f);
  for (size_t i = 0; i < cs.size(); ++i) {
    const float a = ang(rng());
    cs[i] = std::cos(a);
    sn[i] = std::sin(a);
  }
  // src [B, T, H, D] storage viewed as [B, H, T, D]; dst contiguous [B, H, T, D].
  const auto x = randn<T>(n);
  const auto dy = randn<float>(n);
  auto src_at = [&](int64_t bi, int64_t hi, int64_t ti) { return ((bi * t + ti) * heads + hi) * d; };
  auto dst_at = [&](int64_t bi, int64_t hi, int64_t ti) { return ((bi * heads + hi) * t + ti) * d; };
  // The reference's rounding, as docs/kernels.md states it: forward each fp32 product and the sum
  // rounded to fp32; backward each term rounded to T, then the sum.
  std::vector<double> want(n);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < heads; ++hi) {
      for (int64_t ti = 0; ti < t; ++ti) {
        const float* c = cs.data() + (bi * t + ti) * d;
        const float* s = sn.data() + (bi * t + ti) * d;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t si = src_at(bi, hi, ti), di = dst_at(bi, hi, ti);
          if (!backward) {
            const float x1 = f(x[si + i]), x2 = f(x[si + i + half]);
            const volatile float a1 = x1 * c[i], b1 = -x2 * s[i], a2 = x2 * c[i + half], b2 = x1 * s[i + half];
            const volatile float y1 = a1 + b1, y2 = a2 + b2;
            want[di + i] = y1;
            want[di + i + half] = y2;
          } else {
            const float d1 = dy[si + i], d2 = dy[si + i + half];
            const volatile float p1 = d1 * c[i], q1 = d2 * s[i + half], p2 = d2 * c[i + half], q2 = d1 * s[i];
            const float a1 = f(cast<T>(p1)), b1 = f(cast<T>(q1)), a2 = f(cast<T>(p2)), b2 = f(cast<T>(q2));
            const volatile float s1 = a1 + b1, s2 = a2 - b2;
            want[di + i] = f(cast<T>(s1));
            want[di + i + half] = f(cast<T>(s2));
          }
        }
      }
    }
  }
  under_schedules(90, many, [&] {
    kk::RopeMixedParams p;
    p.cos = cs.data();
    p.sin = sn.data();
    p.batch = b;
    p.heads = heads;
    p.seq = t;
    p.dim = d;
    p.table_batched = true;
    p.backward = backward;
    p.dtype = dtype_of<T>();
    p.narrow_index_limit = narrow_limit;
    p.vectorized = vectorized;
    const int64_t src_stride[3] = {t * heads * d, d, heads * d}, dst_stride[3] = {heads * t * d, t * d, d};
    std::copy(src_stride, src_stride + 3, p.src_stride);
    std::copy(dst_stride, dst_stride + 3, p.dst_stride);
    if (!backward) {
      std::vector<float> y(n, NAN);
      p.src = x.data();
      p.dst = y.data();
      kk::emulated::launch_rope_mixed(p, nullptr);
      CHECK_CLOSE("y (bits)", y, want, 0.0);
    } else {
      std::vector<T> dx(n, cast<T>(NAN));
      p.src = dy.data();
      p.dst = dx.data();
      kk::emulated::launch_rope_mixed(p, nullptr);
      CHECK_CLOSE("dx (bits)", dx, want, 0.0);
    }
  });
}

// ---- SwiGLU

template <typename T>
void swiglu_case(int64_t n, bool many) {
  CAPTURE(name_of<T>(), n);
  const auto g = randn<T>(n, 2.0), u = randn<T>(n), dy = randn<T>(n);
  std::vector<double> y_ref(n), dg_ref(n), du_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    const double gv = f(g[i]), uv = f(u[i]), dv = f(dy[i]), s = 1.0 / (1.0 + std::exp(-gv));
    y_ref[i] = gv * s * uv;
    dg_ref[i] = dv * uv * s * (1 + gv * (1 - s));
    du_ref[i] = dv * gv * s;
  }
  under_schedules(90, many, [&] {
    std::vector<T> y(n), dg(n), du(n);
    kk::SwiGluParams p;
    p.gate = g.data();
    p.up = u.data();
    p.dy = dy.data();
    p.y = y.data();
    p.d_gate = dg.data();
    p.d_up = du.data();
    p.n = n;
    p.dtype = dtype_of<T>();
    kk::emulated::launch_swiglu_fwd(p, nullptr);
    kk::emulated::launch_swiglu_bwd(p, nullptr);
    CHECK_CLOSE("y", y, y_ref, 3 * unit<T>() + 1e-6);
    CHECK_CLOSE("d_gate", dg, dg_ref, 3 * unit<T>() + 1e-6);
    CHECK_CLOSE("d_up", du, du_ref, 3 * unit<T>() + 1e-6);
  });
}

// ---- cross-entropy rows

// grad_scale: the gradient backward will send (the loss scale over the targets), applied before
// the gradient is rounded to T; 0 passes no pointer (the kernel's 1).
template <typename T>
void cross_entropy_case(int64_t vocab, double z, bool many, float grad_scale = 0) {
  CAPTURE(name_of<T>(), vocab, z, grad_scale);
  // Targets at the first packs, the last element (in the one-at-a-time tail where the row has one),
  // an ignored row, and the middle (in the second pack of an unrolled group at the longer rows).
  const std::vector<int64_t> labels = {5, -100, vocab - 1, 0, vocab / 2};
  const auto rows = static_cast<int64_t>(labels.size());
  const auto logits = randn<T>(rows * vocab, 3.0);
  std::vector<double> lse_ref(rows), loss_ref(rows), grad_ref(rows * vocab);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) m = std::max<double>(m, f(logits[r * vocab + j]));
    double s = 0;
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(f(logits[r * vocab + j]) - m);
    const double lse = m + std::log(s);
    const bool valid = labels[r] != -100;
    lse_ref[r] = lse;
    loss_ref[r] = valid ? lse - f(logits[r * vocab + labels[r]]) + z * lse * lse : 0.0;
    for (int64_t j = 0; j < vocab; ++j) {
      grad_ref[r * vocab + j] =
          (valid ? std::exp(f(logits[r * vocab + j]) - lse) * (1 + 2 * z * lse) - (j == labels[r] ? 1.0 : 0.0) : 0.0) *
          (grad_scale != 0 ? grad_scale : 1.0);
    }
  }
  under_schedules(90, many, [&] {
    std::vector<T> work = logits;
    std::vector<float> loss(rows), lse(rows);
    kk::CrossEntropyParams p;
    p.logits = work.data();
    p.labels = labels.data();
    p.loss = loss.data();
    p.lse = lse.data();
    p.rows = rows;
    p.vocab = vocab;
    p.ignore_index = -100;
    p.z_loss = static_cast<float>(z);
    p.grad_scale = grad_scale != 0 ? &grad_scale : nullptr;
    p.dtype = dtype_of<T>();
    kk::emulated::launch_cross_entropy_fwd_bwd(p, nullptr);
    CHECK_CLOSE("lse", lse, lse_ref, 1e-5);
    CHECK_CLOSE("loss", loss, loss_ref, 1e-5);
    CHECK_CLOSE("grad", work, grad_ref, 2 * unit<T>() + 1e-6);
  });
}

// ---- flash attention

struct FlashCase {
  int d, hq, hkv, t, s;
  bool causal;
  bool segments = false;
  bool deterministic = false;
  int arch = 80;       // the variant: 80 the cp.async kernels, 70 the Volta ones
  int smem_arch = 0;   // the architecture whose shared-memory limit holds (default: arch)
  int doc_len = 0;     // segments: documents of about this length (0: a cut with probability 0.05)
  bool ranges = true;  // segments: give the launchers the tile-skipping workspace (doc_ranges)
};

template <typename T>
void flash_case(const FlashCase& c, bool many) {
  CAPTURE(name_of<T>(), c.d, c.hq, c.hkv, c.t, c.s, c.causal, c.segments, c.deterministic, c.arch);
  const int B = 1, D = c.d, group = c.hq / c.hkv;
  const auto q = randn<T>(size_t(B) * c.hq * c.t * D), k = randn<T>(size_t(B) * c.hkv * c.s * D),
             v = randn<T>(size_t(B) * c.hkv * c.s * D), dout = randn<T>(size_t(B) * c.hq * c.t * D);
  // Exactly t ids (no spare capacity), so that AddressSanitizer sees a read past the end.
  std::vector<int> seg(c.segments ? c.t : 0);
  if (c.segments) {
    std::bernoulli_distribution cut(c.doc_len > 0 ? 1.0 / c.doc_len : 0.05);
    int id = 0;
    for (int i = 0; i < c.t; ++i) seg[i] = id += cut(rng()) ? 1 : 0;
  }
  std::vector<int> ranges(c.segments && c.ranges ? kk::emulated::flash_doc_ranges_ints(B, c.s) : 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int offset = c.s - c.t;
  // Reference in fp64 from the rounded inputs.
  std::vector<double> out_ref(q.size()), lse_ref(size_t(B) * c.hq * c.t), dq_ref(q.size(), 0.0), dk_ref(k.size(), 0.0),
      dv_ref(v.size(), 0.0);
  for (int h = 0; h < c.hq; ++h) {
    const int hk = h / group;
    const T* qh = q.data() + size_t(h) * c.t * D;
    const T* kh = k.data() + size_t(hk) * c.s * D;
    const T* vh = v.data() + size_t(hk) * c.s * D;
    const T* doh = dout.data() + size_t(h) * c.t * D;
    for (int i = 0; i < c.t; ++i) {
      std::vector<double> p(c.s, 0.0);
      double m = -INFINITY;
      for (int j = 0; j < c.s; ++j) {
        const bool masked = (c.causal && j > i + offset) || (c.segments && seg[i] != seg[j]);
        if (masked) {
          p[j] = -INFINITY;
          continue;
        }
        double dot = 0;
        for (int e = 0; e < D; ++e) dot += f(qh[i * D + e]) * f(kh[j * D + e]);
        p[j] = dot * scale;
        m = std::max(m, p[j]);
      }
      double l = 0;
      for (int j = 0; j < c.s; ++j) l += p[j] == -INFINITY ? 0.0 : std::exp(p[j] - m);
      lse_ref[size_t(h) * c.t + i] = m + std::log(l);
      for (int j = 0; j < c.s; ++j) p[j] = p[j] == -INFINITY ? 0.0 : std::exp(p[j] - m) / l;
      std::vector<double> o(D, 0.0), dp(c.s, 0.0);
      for (int j = 0; j < c.s; ++j) {
        for (int e = 0; e < D; ++e) o[e] += p[j] * f(vh[j * D + e]);
      }
      double delta = 0;
      for (int e = 0; e < D; ++e) {
        out_ref[(size_t(h) * c.t + i) * D + e] = o[e];
        delta += o[e] * f(doh[i * D + e]);
      }
      for (int j = 0; j < c.s; ++j) {
        for (int e = 0; e < D; ++e) dp[j] += f(doh[i * D + e]) * f(vh[j * D + e]);
      }
      for (int j = 0; j < c.s; ++j) {
        const double ds = p[j] * (dp[j] - delta);
        for (int e = 0; e < D; ++e) {
          dq_ref[(size_t(h) * c.t + i) * D + e] += ds * f(kh[j * D + e]) * scale;
          dk_ref[(size_t(hk) * c.s + j) * D + e] += ds * f(qh[i * D + e]) * scale;
          dv_ref[(size_t(hk) * c.s + j) * D + e] += p[j] * f(doh[i * D + e]);
        }
      }
    }
  }
  const double tol = std::is_same_v<T, bf16> ? 3e-2 : 5e-3;  // P and dS are rounded to T before their products
  under_schedules(c.smem_arch != 0 ? c.smem_arch : c.arch, many, [&] {
    kk::FlashFwdParams fp;
    auto shape = [&](kk::FlashShape& p) {
      p.batch = B;
      p.heads_q = c.hq;
      p.heads_kv = c.hkv;
      p.seq_q = c.t;
      p.seq_k = c.s;
      p.head_dim = D;
      p.scale = static_cast<float>(scale);
      p.causal = c.causal;
      p.segment_ids = c.segments ? seg.data() : nullptr;
      p.doc_ranges = ranges.empty() ? nullptr : ranges.data();
      p.dtype = dtype_of<T>();
      p.arch = c.arch;
    };
    shape(fp);
    REQUIRE(kk::emulated::flash_supported(fp));
    std::vector<T> out(q.size());
    std::vector<float> lse(lse_ref.size());
    fp.q = q.data();
    fp.k = k.data();
    fp.v = v.data();
    fp.out = out.data();
    fp.lse = lse.data();
    kk::emulated::launch_flash_fwd(fp, nullptr);
    CHECK_CLOSE("out", out, out_ref, tol);
    CHECK_CLOSE("lse", lse, lse_ref, 1e-3);

    kk::FlashBwdParams bp;
    shape(bp);
    std::vector<float> delta(lse.size()), dq_accum(q.size(), 0.f);
    std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
    bp.q = q.data();
    bp.k = k.data();
    bp.v = v.data();
    bp.out = out.data();
    bp.dout = dout.data();
    bp.lse = lse.data();
    bp.delta = delta.data();
    bp.dq_accum = dq_accum.data();
    bp.dq = dq.data();
    bp.dk = dk.data();
    bp.dv = dv.data();
    bp.deterministic = c.deterministic;
    kk::emulated::launch_flash_bwd(bp, nullptr);
    CHECK_CLOSE("dq", dq, dq_ref, 2 * tol);
    CHECK_CLOSE("dk", dk, dk_ref, 2 * tol);
    CHECK_CLOSE("dv", dv, dv_ref, 2 * tol);
  });
}

void all_kernels(bool many) {
  for (bool residual : {false, true}) {
    for (int64_t cols : {1000, 1003}) {  // 128-bit packs and not; two blocks (fp16: one without rows)
      rmsnorm_case<float>(5, cols, residual, residual, many, 2);
      rmsnorm_case<bf16>(5, cols, residual, !residual, many, 2);
      rmsnorm_case<fp16>(3, cols, residual, residual, many, 2);
    }
    // Rows of 20 .. 2100 128-bit packs: every register variant (forward: 32 .. 1024 threads per
    // row, 4 packs each; backward: 32 .. 1024, 1 pack each), most rows filling them partly, 1024
    // packs exactly, and the widths past the backward's variants (its generic kernel on packs).
    // Narrow rows: 37 of them, not a multiple of the forward's rows per block, and more than the
    // backward's row groups cover in one step (16 groups of 32 threads).
    for (int64_t packs : {20, 60, 100, 250, 500, 1000, 1024, 1500, 2100}) {
      const int64_t rows = packs <= 100 ? 37 : 5;
      rmsnorm_case<float>(rows, packs * 4, residual, residual, many);
      rmsnorm_case<bf16>(rows, packs * 8, residual, !residual, many);
      rmsnorm_case<fp16>(rows, packs * 8, residual, residual, many);
    }
  }
  rope_cases<float>(many);
  rope_cases<bf16>(many);
  rope_cases<fp16>(many);
  for (bool backward : {false, true}) {
    // The 128-bit kernel (D 16 and 128), the scalar one on the same shape (32- and 64-bit pair
    // indices), and on a shape only it takes (D 6).
    rope_mixed_case<bf16>(3, 16, backward, true, int64_t{1} << 30, many);
    rope_mixed_case<fp16>(8, 128, backward, true, int64_t{1} << 30, many);
    for (int64_t limit : {int64_t{1} << 30, int64_t{0}}) {
      rope_mixed_case<bf16>(3, 16, backward, false, limit, many);
      rope_mixed_case<fp16>(3, 16, backward, false, limit, many);
    }
    rope_mixed_case<bf16>(3, 6, backward, true, int64_t{1} << 30, many);
  }
  for (int64_t n : {4096, 1001}) {
    swiglu_case<float>(n, many);
    swiglu_case<bf16>(n, many);
    swiglu_case<fp16>(n, many);
  }
  // 1024: packs, fewer than the block's threads; 1003: one element at a time; 9224: whole groups of
  // kUnroll x kThreads packs (2 x 512) and a tail of single packs (1153 bf16 packs: 1 group + 129,
  // 2306 fp32 packs: 2 groups + 258); 8192 bf16: exactly one group, no tail.
  for (int64_t vocab : {1024, 1003, 9224}) {
    cross_entropy_case<float>(vocab, 0.0, many);
    cross_entropy_case<bf16>(vocab, 1e-3, many);
    cross_entropy_case<fp16>(vocab, 0.0, many);
    cross_entropy_case<fp16>(vocab, 0.0, many, 1024.f);  // fp16 under a loss scale
  }
  cross_entropy_case<bf16>(8192, 1e-3, many, 0.25f);
}

void all_flash(bool many) {
  // Several 64 x 64 tiles with ragged ends, causal, GQA, both head dims and dtypes, both dQ modes.
  flash_case<bf16>({64, 4, 2, 100, 100, true}, many);
  flash_case<fp16>({128, 2, 2, 70, 70, true}, many);
  flash_case<fp16>({64, 2, 1, 17, 80, false}, many);                        // more keys than queries
  flash_case<bf16>({64, 2, 1, 90, 90, true, /*segments=*/true}, many);      // packed documents
  flash_case<bf16>({64, 2, 1, 100, 100, true, false, /*det=*/true}, many);  // deterministic dQ
  flash_case<bf16>({128, 2, 1, 65, 65, true, true, true}, many);
  // Packed documents long enough that whole tile pairs are skipped (doc_ranges), causal and not,
  // both dQ modes; and the same without the workspace (every tile masked instead).
  flash_case<bf16>({64, 2, 1, 300, 300, true, true, false, 80, 0, /*doc_len=*/70}, many);
  flash_case<bf16>({128, 2, 1, 200, 200, true, true, true, 80, 0, 50}, many);
#ifndef KILN_EMU_TSAN  // (ThreadSanitizer runs the emulation ~80x slower: the two above suffice there)
  flash_case<fp16>({64, 2, 2, 300, 300, false, true, true, 80, 0, 70}, many);
  flash_case<bf16>({64, 2, 1, 300, 300, true, true, false, 80, 0, 70, /*ranges=*/false}, many);
#endif
  // The Volta variants (fp16, plain tile loads), held to a V100's 96 KiB where they run there.
  flash_case<fp16>({64, 4, 2, 100, 100, true, false, false, 70}, many);
  flash_case<fp16>({64, 2, 1, 90, 90, true, true, true, 70}, many);
  flash_case<fp16>({64, 2, 1, 17, 80, false, false, false, 70}, many);
  flash_case<fp16>({128, 2, 2, 70, 70, true, false, false, 70, /*smem_arch=*/80}, many);  // 144 KiB: A100's limit
}

}  // namespace

TEST_CASE("every kernel variant (emulated) under four schedules matches fp64 loops", "[kernels][emulated]") {
  all_kernels(false);
}

TEST_CASE("flash attention's variants (emulated) under four schedules match fp64 loops", "[kernels][emulated][flash]") {
  all_flash(false);
}

// [big]: left out of the sanitizer builds' runs (8192 tokens; the packed cases above run there).
TEST_CASE("packed documents: the forward computes only the tile pairs the document lengths leave",
          "[kernels][emulated][flash][big]") {
  // 8 documents in 8192 tokens, causal, as kiln packs them. A (64-query, 64-key) tile pair can be
  // skipped when no query of the one attends any key of the other: counted here from the dense
  // mask (key <= query, same document), independently of the kernel's per-tile id ranges.
  using T = bf16;
  const int S = 8192, D = 64, kTile = 64;
  const int lengths[8] = {700, 1500, 900, 1200, 600, 1100, 1300, 892};
  std::vector<int> seg;
  for (int d = 0; d < 8; ++d) seg.insert(seg.end(), lengths[d], d);
  REQUIRE(static_cast<int>(seg.size()) == S);
  const int tiles = S / kTile;
  long needed = 0, causal = 0;
  for (int i = 0; i < tiles; ++i) {
    for (int j = 0; j <= i; ++j) {
      ++causal;
      bool any = false;
      for (int q = i * kTile; q < (i + 1) * kTile && !any; ++q) {
        for (int k = j * kTile; k < (j + 1) * kTile && k <= q; ++k) {
          if (seg[q] == seg[k]) {
            any = true;
            break;
          }
        }
      }
      needed += any ? 1 : 0;
    }
  }
  const auto q = randn<T>(size_t(S) * D), k = randn<T>(size_t(S) * D), v = randn<T>(size_t(S) * D);
  std::vector<T> out(q.size());
  std::vector<float> lse(S);
  std::vector<int> ranges(kk::emulated::flash_doc_ranges_ints(1, S));
  int done = 0;
  kk::FlashFwdParams p;
  p.batch = 1;
  p.heads_q = p.heads_kv = 1;
  p.seq_q = p.seq_k = S;
  p.head_dim = D;
  p.scale = 0.125f;
  p.causal = true;
  p.segment_ids = seg.data();
  p.doc_ranges = ranges.data();
  p.tiles_done = &done;
  p.dtype = dtype_of<T>();
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.lse = lse.data();
  kk::emulated::launch_flash_fwd(p, nullptr);
  const double skipped = 1.0 - double(needed) / double(causal);
  CAPTURE(needed, causal, skipped);
  CHECK(done == needed);
  CHECK(skipped > 0.8);  // 8 documents: about 7/8 of the causal tile pairs are other documents'
  // A few rows against fp64 (the first and last of some documents, and one inside).
  for (int row : {0, 699, 700, 2199, 2200, 5000, 8191}) {
    std::vector<double> pr(S, 0.0);
    double m = -INFINITY;
    for (int j = 0; j <= row; ++j) {
      if (seg[j] != seg[row]) continue;
      double dot = 0;
      for (int e = 0; e < D; ++e) dot += f(q[size_t(row) * D + e]) * f(k[size_t(j) * D + e]);
      pr[j] = dot * p.scale;
      m = std::max(m, pr[j]);
    }
    double l = 0;
    for (int j = 0; j <= row; ++j) l += seg[j] == seg[row] ? std::exp(pr[j] - m) : 0.0;
    for (int e = 0; e < D; e += 7) {
      double o = 0;
      for (int j = 0; j <= row; ++j) o += seg[j] == seg[row] ? std::exp(pr[j] - m) / l * f(v[size_t(j) * D + e]) : 0.0;
      CAPTURE(row, e);
      CHECK(std::abs(f(out[size_t(row) * D + e]) - o) <= 3e-2 * (1 + std::abs(o)));
    }
    CHECK(std::abs(lse[row] - (m + std::log(l))) < 1e-3 * (1 + std::abs(m)));
  }
}

TEST_CASE("every kernel variant (emulated) under 36 schedules and seeds", "[kernels][emulated][slow]") {
  all_kernels(true);
  all_flash(true);
}

TEST_CASE("the emulation refuses what a GPU refuses", "[kernels][emulated]") {
  // Shared memory: RMSNorm's backward plans one fp32 per column beside block_sum's static slots.
  // At a V100's 96 KiB per block, 24544 columns fit and 24576 do not (98304 + 128 bytes).
  CHECK(kk::emulated::rmsnorm_bwd_static_smem_bytes() == 128);
  CHECK(kk::emulated::rmsnorm_bwd_fits(24544, 96 * 1024));
  CHECK_FALSE(kk::emulated::rmsnorm_bwd_fits(24576, 96 * 1024));
  auto rmsnorm_bwd = [](int64_t cols) {
    const int64_t rows = 1;
    std::vector<float> x(cols, 1.f), w(cols, 1.f), dy(cols, 1.f), dx(cols), partial(cols), rstd(rows, 1.f);
    kk::RmsNormBwdParams b;
    b.x = x.data();
    b.weight = w.data();
    b.dy = dy.data();
    b.rstd = rstd.data();
    b.dx = dx.data();
    b.dweight_partial = partial.data();
    b.rows = rows;
    b.cols = cols;
    b.blocks = 1;
    b.dtype = kk::DType::kFloat32;
    kk::emulated::launch_rmsnorm_bwd(b, nullptr);
  };
  {
    const emu::ConfigScope v100({emu::Schedule::kIndex, emu::Landing::kAtWait, 1, 70});
    rmsnorm_bwd(24544);
    // What the kernel declared, as the emulation counted it, is what the planner counts.
    CHECK(emu::last_launch().static_smem_bytes == static_cast<size_t>(kk::emulated::rmsnorm_bwd_static_smem_bytes()));
    CHECK(emu::last_launch().dynamic_smem_bytes == 24544 * 4);
    // cudaFuncSetAttribute refuses the opt-in, as on a V100 (the static bytes were seen above).
    CHECK_THROWS_WITH(rmsnorm_bwd(24576), Catch::Contains("cannot allow 98304 bytes"));
  }
  // The forward's two block reductions (max and sum) hold one array each.
  {
    std::vector<float> logits(64, 0.f), loss(1), lse(1);
    const std::vector<int64_t> labels = {3};
    kk::CrossEntropyParams p;
    p.logits = logits.data();
    p.labels = labels.data();
    p.loss = loss.data();
    p.lse = lse.data();
    p.rows = 1;
    p.vocab = 64;
    p.dtype = kk::DType::kFloat32;
    kk::emulated::launch_cross_entropy_fwd_bwd(p, nullptr);
    CHECK(emu::last_launch().static_smem_bytes == 256);
  }
  // Flash attention's head-dim-128 Volta blocks do not fit a V100.
  {
    const emu::ConfigScope v100({emu::Schedule::kIndex, emu::Landing::kAtWait, 1, 70});
    std::vector<fp16> q(64 * 128), o(64 * 128);
    std::vector<float> lse(64);
    kk::FlashFwdParams p;
    p.batch = p.heads_q = p.heads_kv = 1;
    p.seq_q = p.seq_k = 64;
    p.head_dim = 128;
    p.scale = 0.1f;
    p.dtype = kk::DType::kFloat16;
    p.arch = 70;
    p.q = p.k = p.v = q.data();
    p.out = o.data();
    p.lse = lse.data();
    CHECK_THROWS_WITH(kk::emulated::launch_flash_fwd(p, nullptr), Catch::Contains("cannot allow"));
  }
}
