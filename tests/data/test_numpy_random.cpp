// numpy's permutation in C++ (data/numpy_random.h), the permutation behind LLaMA-Factory's
// train/eval split. Reference: numpy itself, through tests/python/fixtures/numpy_permutations.json
// (written by make_numpy_permutations.py; test_numpy_permutations_fixture.py keeps it equal to the
// installed numpy): SeedSequence's state, PCG64's state, raw stream and buffered 32-bit draws, and
// default_rng(seed).permutation(n) for every seed and n there.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/data/numpy_random.h"

using namespace kiln::data;

namespace {

nlohmann::json golden() {
  std::ifstream in(KILN_PYTHON_FIXTURES "/numpy_permutations.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

uint64_t hex64(const nlohmann::json& v) {
  return std::stoull(v.get<std::string>(), nullptr, 16);
}

std::string hex128(uint64_t hi, uint64_t lo) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "0x%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

// make_numpy_permutations.py perm_hash: the wrapping sum of splitmix64's finalizer over
// perm[i] + i * 0x9E3779B97F4A7C15.
uint64_t perm_hash(const std::vector<int64_t>& perm) {
  uint64_t h = 0;
  for (size_t i = 0; i < perm.size(); ++i) {
    uint64_t x = static_cast<uint64_t>(perm[i]) + i * 0x9E3779B97F4A7C15ULL;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    h += x;
  }
  return h;
}

}  // namespace

TEST_CASE("numpy SeedSequence and PCG64 equal numpy's for integer seeds", "[numpy_random]") {
  const nlohmann::json g = golden();
  REQUIRE(g["seeds"].size() >= 8);
  for (const auto& s : g["seeds"]) {
    const uint64_t seed = std::stoull(s["seed"].get<std::string>());
    INFO("seed " << seed);

    const std::vector<uint64_t> words = NumpySeedSequence(seed).generate_state_u64(4);
    REQUIRE(words.size() == 4);
    for (size_t k = 0; k < 4; ++k) CHECK(words[k] == hex64(s["seed_sequence_u64"][k]));
    // The uint64 form is the uint32 form paired little-endian.
    const std::vector<uint32_t> halves = NumpySeedSequence(seed).generate_state_u32(8);
    for (size_t k = 0; k < 4; ++k) CHECK(words[k] == (halves[2 * k] | (uint64_t{halves[2 * k + 1]} << 32)));

    NumpyPcg64 rng(seed);
    CHECK(hex128(rng.state_high(), rng.state_low()) == s["pcg64_state"].get<std::string>());
    CHECK(hex128(rng.inc_high(), rng.inc_low()) == s["pcg64_inc"].get<std::string>());
    for (const auto& v : s["random_raw"]) CHECK(rng.next_uint64() == hex64(v));

    NumpyPcg64 rng32(seed);
    for (const auto& v : s["next_uint32"]) CHECK(rng32.next_uint32() == v.get<uint32_t>());
  }
}

TEST_CASE("numpy_permutation equals default_rng(seed).permutation(n)", "[numpy_random]") {
  const nlohmann::json g = golden();
  size_t cases = 0;
  for (const auto& s : g["seeds"]) {
    const uint64_t seed = std::stoull(s["seed"].get<std::string>());
    for (const auto& c : s["permutations"]) {
      const auto n = c["n"].get<int64_t>();
      INFO("seed " << seed << " n " << n);
      const std::vector<int64_t> perm = numpy_permutation(seed, n);
      REQUIRE(perm.size() == static_cast<size_t>(n));
      CHECK(perm_hash(perm) == hex64(c["hash"]));
      if (c.contains("perm")) {
        CHECK(perm == c["perm"].get<std::vector<int64_t>>());
      } else {
        const auto head = c["head"].get<std::vector<int64_t>>();
        const auto tail = c["tail"].get<std::vector<int64_t>>();
        CHECK(std::vector<int64_t>(perm.begin(), perm.begin() + head.size()) == head);
        CHECK(std::vector<int64_t>(perm.end() - tail.size(), perm.end()) == tail);
      }
      ++cases;
    }
  }
  CHECK(cases >= 64);
}

TEST_CASE("numpy_permutation: LLaMA-Factory notes' vectors and edge cases", "[numpy_random]") {
  // docs/llamafactory.md, section 2 (read off numpy by hand there).
  const std::vector<int64_t> p7 = numpy_permutation(7, 380);
  CHECK(std::vector<int64_t>(p7.begin(), p7.begin() + 10) ==
        std::vector<int64_t>{155, 297, 232, 34, 61, 225, 0, 257, 203, 361});
  CHECK(numpy_permutation(42, 10) == std::vector<int64_t>{5, 6, 0, 7, 3, 2, 4, 9, 1, 8});
  // np.arange of a negative count is empty, so is its permutation.
  CHECK(numpy_permutation(1, -3).empty());
  // A permutation: every index once.
  std::vector<int64_t> p = numpy_permutation(123, 5000);
  std::vector<bool> seen(p.size(), false);
  for (int64_t v : p) {
    REQUIRE(v >= 0);
    REQUIRE(v < 5000);
    REQUIRE_FALSE(seen[v]);
    seen[v] = true;
  }
}

TEST_CASE("numpy random_interval: 32-bit draws below 2^32, 64-bit above", "[numpy_random]") {
  // distributions.c random_interval: max 0 draws nothing; a 32-bit max takes the buffered
  // next_uint32 halves (two per 64-bit step), a larger one whole next_uint64 draws.
  NumpyPcg64 a(5), b(5);
  CHECK(numpy_random_interval(a, 0) == 0);
  CHECK(a.next_uint64() == b.next_uint64());

  NumpyPcg64 c(9), d(9);
  const uint64_t raw = d.next_uint64();
  CHECK(numpy_random_interval(c, 0xffffffffULL) == (raw & 0xffffffffULL));
  CHECK(numpy_random_interval(c, 0xffffffffULL) == (raw >> 32));

  NumpyPcg64 e(11), f(11);
  CHECK(numpy_random_interval(e, ~0ULL) == f.next_uint64());
}

TEST_CASE("numpy Generator.choice with probabilities equals numpy's draws", "[numpy_random]") {
  const nlohmann::json g = golden();
  REQUIRE(g["choices"].size() >= 5);
  for (const auto& c : g["choices"]) {
    const uint64_t seed = std::stoull(c["seed"].get<std::string>());
    const auto p = c["p"].get<std::vector<double>>();
    const int64_t size = c["size"].get<int64_t>();
    NumpyPcg64 rng(seed);
    INFO("seed " << seed << " size " << size);
    CHECK(numpy_choice(rng, p, size) == c["draws"][0].get<std::vector<int64_t>>());
    CHECK(numpy_choice(rng, p, size) == c["draws"][1].get<std::vector<int64_t>>());
  }
}

TEST_CASE("numpy's checks of choice's probabilities, in numpy's words", "[numpy_random]") {
  CHECK_NOTHROW(numpy_check_probabilities({0.7, 0.2, 0.1}));
  CHECK_NOTHROW(numpy_check_probabilities({0.5, 0.5 + 1e-9}));  // within sqrt(eps) ~ 1.49e-8
  CHECK_THROWS_WITH(numpy_check_probabilities({0.5, 0.6}), "Probabilities do not sum to 1");
  CHECK_THROWS_WITH(numpy_check_probabilities({1.5, -0.5}), "Probabilities are not non-negative");
  CHECK_THROWS_WITH(numpy_check_probabilities({0.5, std::nan("")}), "Probabilities contain NaN");
}
