// numpy's random permutation, bit for bit, without Python. LLaMA-Factory 0.9.5 splits a dataset's
// documents into train and eval with HF datasets' Dataset.train_test_split(test_size, seed), which
// takes np.random.default_rng(seed).permutation(n) and uses test = permutation[:n_test], train =
// permutation[n_test:] (docs/llamafactory.md, section 2). To give the same documents,
// in the same order, kiln has to draw the same permutation: numpy's Generator over PCG64, seeded
// through SeedSequence. Each piece below names the numpy 2.x source it follows; the golden values
// are tests/python/fixtures/numpy_permutations.json (written by numpy itself).
//
// Only the paths numpy takes for an integer seed and an integer n are reproduced: a SeedSequence
// from one non-negative integer (no spawn key, pool size 4), PCG64 (XSL-RR output, not
// PCG64DXSM), and Generator.shuffle's Fisher-Yates over random_interval.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace kiln::data {

// numpy.random.SeedSequence(entropy) for an integer entropy (numpy/random/bit_generator.pyx,
// class SeedSequence: __init__, mix_entropy, generate_state; helpers hashmix, mix,
// _int_to_uint32_array). default_rng(seed) hands the seed to PCG64, which hands it to this.
class NumpySeedSequence {
 public:
  static constexpr int kPoolSize = 4;  // DEFAULT_POOL_SIZE

  explicit NumpySeedSequence(uint64_t entropy);

  // generate_state(n_words, np.uint32) and generate_state(n_words, np.uint64): the uint64 form
  // draws 2 * n_words uint32 words and pairs them little-endian (low word first).
  std::vector<uint32_t> generate_state_u32(int n_words) const;
  std::vector<uint64_t> generate_state_u64(int n_words) const;

  const std::array<uint32_t, kPoolSize>& pool() const { return pool_; }

 private:
  std::array<uint32_t, kPoolSize> pool_{};
};

// numpy.random.PCG64 (numpy/random/_pcg64.pyx, PCG64.__init__; numpy/random/src/pcg64/pcg64.h and
// pcg64.c): the 128-bit LCG with the XSL-RR 128/64 output, and numpy's buffering of 32-bit draws.
class NumpyPcg64 {
 public:
  // PCG64(seed): SeedSequence(seed).generate_state(4, np.uint64) = [s_hi, s_lo, i_hi, i_lo] given
  // to pcg64_set_seed as the initial state and the stream selector.
  explicit NumpyPcg64(uint64_t seed);
  // pcg64_set_seed itself (pcg64.c -> pcg_setseq_128_srandom_r), for tests of the raw stream.
  explicit NumpyPcg64(const std::array<uint64_t, 4>& seed_words);

  // pcg64_next64: one step, XSL-RR output (PCG64.random_raw gives these).
  uint64_t next_uint64();
  // pcg64_next32: the low half of a 64-bit draw, its high half kept for the next call. A 64-bit
  // draw in between leaves that kept half alone, as numpy does.
  uint32_t next_uint32();

  uint64_t state_high() const { return state_hi_; }
  uint64_t state_low() const { return state_lo_; }
  uint64_t inc_high() const { return inc_hi_; }
  uint64_t inc_low() const { return inc_lo_; }

 private:
  void step();

  uint64_t state_hi_ = 0, state_lo_ = 0, inc_hi_ = 0, inc_lo_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// random_interval(bitgen, max) (numpy/random/src/distributions/distributions.c): a uniform value
// in [0, max] by masking to the smallest 2^k - 1 >= max and rejecting; 32-bit draws when max fits
// in 32 bits, else 64-bit draws. This is what Generator.shuffle calls (not the Lemire
// random_bounded_uint64 that _shuffle_int, i.e. choice, uses).
uint64_t numpy_random_interval(NumpyPcg64& rng, uint64_t max);

// numpy.random.default_rng(seed).permutation(n) (numpy/random/_generator.pyx, Generator.permutation
// -> Generator.shuffle -> _shuffle_raw): np.arange(n) shuffled by Fisher-Yates from the end, i =
// n-1 down to 1, swapping element i with element random_interval(i). n <= 0 gives an empty vector.
std::vector<int64_t> numpy_permutation(uint64_t seed, int64_t n);

// Generator.random(): next_double of PCG64 (pcg64.h pcg64_next_double), (next_uint64 >> 11) x 2^-53,
// a 64-bit draw that leaves the buffered 32-bit half alone.
double numpy_random_double(NumpyPcg64& rng);

// Generator.choice(n, size, p=p) with replacement (_generator.pyx): p is checked as numpy checks
// it (1-d of n non-negative numbers whose Kahan sum is within sqrt(DBL_EPSILON) of 1; otherwise
// std::invalid_argument with numpy's words), then cdf = cumsum(p) / cdf[-1], `size` uniform draws
// u = random(), and each index = cdf.searchsorted(u, side='right'). Datasets' interleave_datasets
// draws its sources this way, 1000 at a time (data/mixture.h).
void numpy_check_probabilities(const std::vector<double>& p);
std::vector<int64_t> numpy_choice(NumpyPcg64& rng, const std::vector<double>& p, int64_t size);

// random_bounded_uint64(bitgen, off=0, rng, mask, use_masked=false) (distributions.c): a uniform
// value in [0, rng] by Lemire's method, the one Generator.integers uses (_generator.pyx sets
// _masked = False). rng 0 draws nothing; rng < 2^32 - 1 takes buffered 32-bit draws
// (buffered_bounded_lemire_uint32, whose bcnt/buf are unused: the kept half is PCG64's own),
// rng = 2^32 - 1 one next_uint32, rng = 2^64 - 1 one next_uint64, others bounded_lemire_uint64
// (128-bit product, rejection below (2^64 - 1 - rng) % (rng + 1)). random_bounded_uint64_fill
// draws its elements one after another the same way, so an array is these values in order.
uint64_t numpy_bounded_uint64(NumpyPcg64& rng, uint64_t range);

// Generator.integers(low, high, size) for the default dtype int64 and endpoint=False
// (_generator.pyx integers -> _bounded_integers.pyx.in _rand_int64 -> random_bounded_uint64_fill):
// low + numpy_bounded_uint64(high - 1 - low), `size` times. size <= 0 draws nothing;
// high <= low is std::invalid_argument in numpy's words, "high <= 0" for low 0, else "low >= high"
// (numpy checks it only when size > 0).
// datasets' shuffle buffer draws its slots as integers(0, buffer_size, size=1000), and its
// epoch seeds as integers(0, 1 << 63) (data/stream_order.h).
std::vector<int64_t> numpy_integers(NumpyPcg64& rng, int64_t low, int64_t high, int64_t size);

// Generator.shuffle(x) of a Python list (_generator.pyx shuffle, the "Untyped path"): for i =
// n-1 down to 1, j = random_interval(i), swap x[i] and x[j]; the same draws as
// numpy_permutation, from the generator's current state.
void numpy_shuffle(NumpyPcg64& rng, std::vector<int64_t>& x);

}  // namespace kiln::data
