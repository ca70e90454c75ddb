// LLaMA-Factory's dataset mixtures (datasets' interleave_datasets): see mixture.h.
#include "kiln/data/mixture.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/data/numpy_random.h"

namespace kiln::data {

MixStrategy parse_mix_strategy(const std::string& name) {
  if (name == "concat") return MixStrategy::kConcat;
  if (name == "interleave_under") return MixStrategy::kInterleaveUnder;
  if (name == "interleave_over") return MixStrategy::kInterleaveOver;
  if (name == "interleave_once") {
    // LLaMA-Factory maps it to all_exhausted_without_replacement, which datasets 4.0's
    // _interleave_map_style_datasets refuses.
    throw std::invalid_argument(
        "all_exhausted_without_replacement is not supported. Please enter a valid stopping_strategy. (datasets "
        "4.0's words: LLaMA-Factory 0.9.5 maps interleave_once to it, and datasets refuses it for the map-style "
        "datasets LLaMA-Factory loads; use interleave_under or interleave_over)");
  }
  throw std::invalid_argument(
      fmt::format("Unknown mixing strategy: {}. (LLaMA-Factory's words; kiln knows concat, "
                  "interleave_under and interleave_over)",
                  name));
}

std::vector<int64_t> mix_documents(const std::vector<int64_t>& lengths, MixStrategy strategy,
                                   const std::vector<double>& probabilities, uint64_t seed) {
  const size_t k = lengths.size();
  const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  std::vector<int64_t> out;
  if (k <= 1 || strategy == MixStrategy::kConcat) {  // merge_dataset returns one dataset as it is
    out.resize(static_cast<size_t>(total));
    std::iota(out.begin(), out.end(), int64_t{0});
    return out;
  }
  for (size_t i = 0; i < k; ++i) {
    if (lengths[i] <= 0)
      throw std::invalid_argument(fmt::format("dataset {} of the mixture holds no documents", i + 1));
  }
  std::vector<int64_t> offsets(k, 0);
  for (size_t i = 1; i < k; ++i) offsets[i] = offsets[i - 1] + lengths[i - 1];
  const bool oversampling = strategy == MixStrategy::kInterleaveOver;
  if (probabilities.empty()) {
    const int64_t rounds = oversampling ? *std::max_element(lengths.begin(), lengths.end())
                                        : *std::min_element(lengths.begin(), lengths.end());
    out.reserve(static_cast<size_t>(rounds) * k);
    for (int64_t r = 0; r < rounds; ++r) {
      for (size_t i = 0; i < k; ++i) out.push_back(offsets[i] + r % lengths[i]);
    }
    return out;
  }
  if (probabilities.size() != k) {
    throw std::invalid_argument(
        fmt::format("The length of dataset and interleave probs should be identical. ({} "
                    "datasets, {} probabilities)",
                    k, probabilities.size()));
  }
  numpy_check_probabilities(probabilities);
  if (oversampling) {
    for (size_t i = 0; i < k; ++i) {
      if (probabilities[i] == 0) {
        throw std::invalid_argument(
            fmt::format("dataset {} has probability 0, so interleave_over (all_exhausted) would never end: datasets "
                        "draws forever waiting for it to be exhausted",
                        i + 1));
      }
    }
  }
  NumpyPcg64 rng(seed);
  std::vector<bool> exhausted(k, false);
  std::vector<int64_t> current(k, 0);
  size_t exhausted_count = 0;
  for (;;) {
    for (const int64_t source : numpy_choice(rng, probabilities, 1000)) {
      if (oversampling ? exhausted_count == k : exhausted_count > 0) return out;
      const auto s = static_cast<size_t>(source);
      out.push_back(current[s] + offsets[s]);
      if (++current[s] >= lengths[s]) {
        if (!exhausted[s]) ++exhausted_count;
        exhausted[s] = true;
        current[s] = 0;
      }
    }
  }
}

}  // namespace kiln::data
