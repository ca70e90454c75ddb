// numpy's SeedSequence, PCG64 and Generator.permutation for LLaMA-Factory's train/eval split
// (numpy_random.h says why). Followed: numpy 2.4.6's numpy/random/bit_generator.pyx,
// _pcg64.pyx, src/pcg64/pcg64.h and pcg64.c, src/distributions/distributions.c, _generator.pyx.
// The algorithms have been stable since numpy 1.17 introduced Generator; the fixture test checks
// them against the installed numpy.
#include "kiln/data/numpy_random.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace kiln::data {

namespace {

// GCC and Clang's 128-bit integer, the native path of pcg64.h (pcg128_t = __uint128_t where
// __SIZEOF_INT128__ is defined); __extension__ keeps -Wpedantic quiet.
__extension__ typedef unsigned __int128 u128;

u128 make128(uint64_t hi, uint64_t lo) {
  return (static_cast<u128>(hi) << 64) | lo;
}

// bit_generator.pyx's constants (SeedSequence's hash, after Melissa O'Neill's seed_seq_fe).
constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr int kXShift = 16;  // XSHIFT = uint32 itemsize * 8 // 2

// bit_generator.pyx hashmix: the multiplier is carried from call to call (in-out), so the order
// of calls in mix_entropy matters.
uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

// bit_generator.pyx mix.
uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// pcg64.h PCG_DEFAULT_MULTIPLIER_128.
constexpr uint64_t kMultHigh = 2549297995355413924ULL;
constexpr uint64_t kMultLow = 4865540595714422341ULL;

}  // namespace

NumpySeedSequence::NumpySeedSequence(uint64_t entropy) {
  // bit_generator.pyx _int_to_uint32_array: a Python int as uint32 words, lowest first; 0 is one
  // word [0]. With no spawn key, get_assembled_entropy is these words unpadded.
  std::vector<uint32_t> words;
  if (entropy == 0) words.push_back(0);
  for (uint64_t v = entropy; v > 0; v >>= 32) words.push_back(static_cast<uint32_t>(v));

  // SeedSequence.mix_entropy: hash each word (or 0) into the pool, cross-mix every pool word into
  // every other, then fold in the words beyond the pool (none for a 64-bit seed, kept for form).
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i) {
    pool_[i] = hashmix(i < static_cast<int>(words.size()) ? words[i] : 0, hash_const);
  }
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
    }
  }
  for (size_t src = kPoolSize; src < words.size(); ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) pool_[dst] = mix(pool_[dst], hashmix(words[src], hash_const));
  }
}

std::vector<uint32_t> NumpySeedSequence::generate_state_u32(int n_words) const {
  // SeedSequence.generate_state: cycle through the pool, each word hashed with a fresh running
  // multiplier (INIT_B, times MULT_B per word).
  std::vector<uint32_t> state(n_words > 0 ? n_words : 0);
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < state.size(); ++i) {
    uint32_t v = pool_[i % kPoolSize];
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    state[i] = v;
  }
  return state;
}

std::vector<uint64_t> NumpySeedSequence::generate_state_u64(int n_words) const {
  // generate_state(n, np.uint64): 2n uint32 words viewed as '<u8' (little-endian pairs).
  const std::vector<uint32_t> w = generate_state_u32(2 * n_words);
  std::vector<uint64_t> out(w.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = w[2 * i] | (static_cast<uint64_t>(w[2 * i + 1]) << 32);
  return out;
}

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  // _pcg64.pyx PCG64.__init__: val = seed_seq.generate_state(4, np.uint64), then
  // pcg64_set_seed(state, seed=val[0:2], inc=val[2:4]).
  const std::vector<uint64_t> v = NumpySeedSequence(seed).generate_state_u64(4);
  *this = NumpyPcg64(std::array<uint64_t, 4>{v[0], v[1], v[2], v[3]});
}

NumpyPcg64::NumpyPcg64(const std::array<uint64_t, 4>& seed_words) {
  // pcg64.c pcg64_set_seed: initstate = seed[0] << 64 | seed[1], initseq = inc[0] << 64 | inc[1];
  // pcg64.h pcg_setseq_128_srandom_r: state = 0, inc = initseq << 1 | 1, step, state +=
  // initstate, step. _reset_state_variables clears the kept 32-bit half.
  const u128 initstate = make128(seed_words[0], seed_words[1]);
  const u128 initseq = make128(seed_words[2], seed_words[3]);
  const u128 inc = (initseq << 1) | 1;
  inc_hi_ = static_cast<uint64_t>(inc >> 64);
  inc_lo_ = static_cast<uint64_t>(inc);
  state_hi_ = state_lo_ = 0;
  step();
  const u128 s = make128(state_hi_, state_lo_) + initstate;
  state_hi_ = static_cast<uint64_t>(s >> 64);
  state_lo_ = static_cast<uint64_t>(s);
  step();
  has_uint32_ = false;
  uinteger_ = 0;
}

void NumpyPcg64::step() {
  // pcg64.h pcg_setseq_128_step_r: state = state * PCG_DEFAULT_MULTIPLIER_128 + inc (mod 2^128).
  const u128 s = make128(state_hi_, state_lo_) * make128(kMultHigh, kMultLow) + make128(inc_hi_, inc_lo_);
  state_hi_ = static_cast<uint64_t>(s >> 64);
  state_lo_ = static_cast<uint64_t>(s);
}

uint64_t NumpyPcg64::next_uint64() {
  // pcg64.h pcg_setseq_128_xsl_rr_64_random_r: step first, then output XSL-RR of the new state:
  // rotate (high ^ low) right by the top 6 bits of the state.
  step();
  const uint64_t x = state_hi_ ^ state_lo_;
  const unsigned rot = static_cast<unsigned>(state_hi_ >> 58);
  return (x >> rot) | (x << ((-rot) & 63));
}

uint32_t NumpyPcg64::next_uint32() {
  // pcg64.h pcg64_next32.
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffULL);
}

uint64_t numpy_random_interval(NumpyPcg64& rng, uint64_t max) {
  // distributions.c random_interval.
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (rng.next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (rng.next_uint64() & mask)) > max) {
    }
  }
  return value;
}

std::vector<int64_t> numpy_permutation(uint64_t seed, int64_t n) {
  // _generator.pyx Generator.permutation(int): arr = np.arange(n); self.shuffle(arr). shuffle's
  // 1-d ndarray path is _shuffle_raw(bitgen, n, first=1, ...): for i in reversed(range(1, n)):
  // j = random_interval(bitgen, i); swap arr[i], arr[j]. An empty arange is left alone (no draw).
  std::vector<int64_t> arr(n > 0 ? static_cast<size_t>(n) : 0);
  std::iota(arr.begin(), arr.end(), int64_t{0});
  if (arr.size() < 2) return arr;
  NumpyPcg64 rng(seed);
  for (int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(numpy_random_interval(rng, static_cast<uint64_t>(i)));
    std::swap(arr[i], arr[j]);
  }
  return arr;
}

double numpy_random_double(NumpyPcg64& rng) {
  return static_cast<double>(rng.next_uint64() >> 11) * (1.0 / 9007199254740992.0);
}

void numpy_check_probabilities(const std::vector<double>& p) {
  // _generator.pyx Generator.choice: p_sum = kahan_sum(p); NaN, negative entries and a sum
  // farther than atol = sqrt(finfo(float64).eps) from 1 are errors, in this order.
  if (p.empty()) throw std::invalid_argument("a must be a positive integer unless no samples are taken");
  double sum = p[0], c = 0.0;  // distributions.c kahan_sum
  for (size_t i = 1; i < p.size(); ++i) {
    const double y = p[i] - c;
    const double t = sum + y;
    c = (t - sum) - y;
    sum = t;
  }
  if (std::isnan(sum)) throw std::invalid_argument("Probabilities contain NaN");
  if (std::any_of(p.begin(), p.end(), [](double v) { return v < 0; }))
    throw std::invalid_argument("Probabilities are not non-negative");
  if (std::abs(sum - 1.0) > std::sqrt(std::numeric_limits<double>::epsilon()))
    throw std::invalid_argument("Probabilities do not sum to 1");
}

std::vector<int64_t> numpy_choice(NumpyPcg64& rng, const std::vector<double>& p, int64_t size) {
  numpy_check_probabilities(p);
  std::vector<double> cdf(p.size());
  double run = 0.0;
  for (size_t i = 0; i < p.size(); ++i) cdf[i] = run += p[i];  // ndarray.cumsum: sequential
  const double last = cdf.back();
  for (double& v : cdf) v /= last;
  std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(size, 0)));
  for (auto& idx : out) {
    const double u = numpy_random_double(rng);
    idx = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();  // searchsorted side='right'
  }
  return out;
}

uint64_t numpy_bounded_uint64(NumpyPcg64& rng, uint64_t range) {
  // distributions.c random_bounded_uint64 with use_masked false.
  if (range == 0) return 0;
  if (range <= 0xffffffffULL) {
    if (range == 0xffffffffULL) return rng.next_uint32();
    // buffered_bounded_lemire_uint32.
    const uint32_t rng_excl = static_cast<uint32_t>(range) + 1;
    uint64_t m = static_cast<uint64_t>(rng.next_uint32()) * rng_excl;
    uint32_t leftover = static_cast<uint32_t>(m);
    if (leftover < rng_excl) {
      const uint32_t threshold = (0xffffffffU - static_cast<uint32_t>(range)) % rng_excl;
      while (leftover < threshold) {
        m = static_cast<uint64_t>(rng.next_uint32()) * rng_excl;
        leftover = static_cast<uint32_t>(m);
      }
    }
    return m >> 32;
  }
  if (range == ~0ULL) return rng.next_uint64();
  // bounded_lemire_uint64, the __SIZEOF_INT128__ branch.
  const uint64_t rng_excl = range + 1;
  u128 m = static_cast<u128>(rng.next_uint64()) * rng_excl;
  uint64_t leftover = static_cast<uint64_t>(m);
  if (leftover < rng_excl) {
    const uint64_t threshold = (~0ULL - range) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<u128>(rng.next_uint64()) * rng_excl;
      leftover = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

std::vector<int64_t> numpy_integers(NumpyPcg64& rng, int64_t low, int64_t high, int64_t size) {
  // _bounded_integers.pyx.in _rand_int64: an empty size returns before any check.
  if (size <= 0) return {};
  // format_bounds_error(closed=False, low).
  if (high <= low) throw std::invalid_argument(low == 0 ? "high <= 0" : "low >= high");
  const uint64_t range = static_cast<uint64_t>(high) - 1 - static_cast<uint64_t>(low);
  std::vector<int64_t> out(static_cast<size_t>(size));
  for (auto& v : out) v = static_cast<int64_t>(static_cast<uint64_t>(low) + numpy_bounded_uint64(rng, range));
  return out;
}

void numpy_shuffle(NumpyPcg64& rng, std::vector<int64_t>& x) {
  for (size_t i = x.size() > 0 ? x.size() - 1 : 0; i >= 1; --i) {
    std::swap(x[i], x[numpy_random_interval(rng, i)]);
  }
}

}  // namespace kiln::data
