// LLaMA-Factory's mixtures (data/mixture.h) against HF datasets 4.0.0 itself: every expected list
// below is what datasets.interleave_datasets returned for datasets whose rows are their own
// indices in the concatenation (the first three are the docstring examples of datasets/combine.py,
// 10 -> 3, 20 -> 6, ...). The long cases cross datasets' 1000-draw chunks of the source stream.
#include <numeric>
#include <stdexcept>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/data/mixture.h"

using namespace kiln::data;
using V = std::vector<int64_t>;

TEST_CASE("mix_documents equals datasets.interleave_datasets", "[mixture]") {
  const auto under = MixStrategy::kInterleaveUnder, over = MixStrategy::kInterleaveOver;
  CHECK(mix_documents({3, 3, 3}, over, {0.7, 0.2, 0.1}, 42) ==
        V{3, 0, 4, 1, 2, 6, 5, 3, 0, 1, 2, 7, 0, 4, 1, 2, 0, 1, 5, 2, 3, 0, 8});
  CHECK(mix_documents({3, 3, 3}, under, {0.7, 0.2, 0.1}, 42) == V{3, 0, 4, 1, 2});
  CHECK(mix_documents({3, 4, 5}, under, {}, 0) == V{0, 3, 7, 1, 4, 8, 2, 5, 9});
  CHECK(mix_documents({3, 4, 5}, over, {}, 0) == V{0, 3, 7, 1, 4, 8, 2, 5, 9, 0, 6, 10, 1, 3, 11});
  CHECK(mix_documents({3, 4, 5}, over, {0.7, 0.2, 0.1}, 42) ==
        V{3, 0, 4, 1, 2, 7, 5, 6, 0, 1, 2, 8, 0, 3, 1, 2, 0, 1, 4, 2, 5, 0, 9, 6, 3, 1, 2, 0, 1, 2, 4, 10, 0, 1,
          2, 0, 1, 2, 0, 1, 2, 5, 6, 0, 3, 4, 1, 2, 0, 1, 2, 0, 5, 1, 6, 3, 2, 0, 1, 2, 0, 1, 2, 4, 0, 1,  2, 0,
          1, 2, 0, 1, 5, 2, 0, 1, 2, 0, 1, 6, 2, 0, 3, 1, 2, 0, 4, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 11});
  // 3554 draws (four chunks of 1000) until the rare source is exhausted.
  const V rare = mix_documents({5, 2000}, over, {0.001, 0.999}, 3);
  REQUIRE(rare.size() == 3554);
  CHECK(V(rare.begin(), rare.begin() + 5) == V{5, 6, 7, 8, 9});
  CHECK(V(rare.end() - 5, rare.end()) == V{1550, 1551, 1552, 1553, 4});
  CHECK(std::accumulate(rare.begin(), rare.end(), int64_t{0}) == 3215681);
  const V rare_under = mix_documents({5, 2000}, under, {0.001, 0.999}, 3);
  CHECK(rare_under.size() == 2002);
  CHECK(std::accumulate(rare_under.begin(), rare_under.end(), int64_t{0}) == 2009001);
}

TEST_CASE("mix_documents: concat and one dataset keep the documents in order", "[mixture]") {
  CHECK(mix_documents({2, 3}, MixStrategy::kConcat, {}, 1) == V{0, 1, 2, 3, 4});
  CHECK(mix_documents({4}, MixStrategy::kInterleaveOver, {1.0}, 1) == V{0, 1, 2, 3});
}

TEST_CASE("mixture errors say what datasets, numpy or LLaMA-Factory say", "[mixture]") {
  CHECK(parse_mix_strategy("interleave_under") == MixStrategy::kInterleaveUnder);
  CHECK_THROWS_WITH(parse_mix_strategy("interleave_once"), Catch::Contains("all_exhausted_without_replacement"));
  CHECK_THROWS_WITH(parse_mix_strategy("zip"), Catch::Contains("Unknown mixing strategy: zip"));
  CHECK_THROWS_WITH(mix_documents({2, 2}, MixStrategy::kInterleaveUnder, {0.5, 0.6}, 1),
                    "Probabilities do not sum to 1");
  CHECK_THROWS_WITH(mix_documents({2, 2, 2}, MixStrategy::kInterleaveUnder, {0.5, 0.5}, 1),
                    Catch::Contains("should be identical"));
  CHECK_THROWS_WITH(mix_documents({2, 2}, MixStrategy::kInterleaveOver, {1.0, 0.0}, 1), Catch::Contains("never end"));
  CHECK_THROWS_AS(mix_documents({2, 0}, MixStrategy::kInterleaveUnder, {}, 1), std::invalid_argument);
}
