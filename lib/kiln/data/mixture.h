// How LLaMA-Factory 0.9.5 merges the datasets of `dataset: a,b,...` (mix_strategy), as document
// indices into their concatenation: llamafactory/data/data_utils.py merge_dataset calls HF
// datasets 4.0's interleave_datasets (arrow_dataset.py _interleave_map_style_datasets) with the
// training seed. The merge comes after each dataset's max_samples and before the val_size split
// and packing (lf_examples.h), so its output is the document order those steps see.
//
//   concat            the datasets one after another (also any strategy with one dataset);
//   interleave_under  stopping_strategy first_exhausted;
//   interleave_over   stopping_strategy all_exhausted.
// Without probabilities: round robin, one document of each dataset per round. first_exhausted
// stops after min(lengths) full rounds; all_exhausted runs max(lengths) rounds, each dataset
// indexed modulo its length. With probabilities: numpy.random.default_rng(seed).choice(k, 1000,
// p) draws the source of each next document, 1000 draws at a time; each source walks its
// documents in order and restarts at 0 once exhausted; the merge stops before the draw that finds
// any (under) or all (over) sources exhausted.
// `interleave_once` (datasets' all_exhausted_without_replacement) is refused by datasets 4.0 for
// map-style datasets, so it is refused here with its words.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::data {

enum class MixStrategy { kConcat, kInterleaveUnder, kInterleaveOver };

// LLaMA-Factory's names (concat, interleave_under, interleave_over); std::invalid_argument for the
// others, in LLaMA-Factory's or datasets' words.
MixStrategy parse_mix_strategy(const std::string& name);

// The merged documents as indices into the concatenation of datasets of `lengths` documents.
// `probabilities` empty = none; otherwise one per dataset, checked as numpy checks them
// (std::invalid_argument). A dataset with no documents is an error for the interleaving
// strategies (datasets would index past it).
std::vector<int64_t> mix_documents(const std::vector<int64_t>& lengths, MixStrategy strategy,
                                   const std::vector<double>& probabilities, uint64_t seed);

}  // namespace kiln::data
