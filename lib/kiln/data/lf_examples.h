// LLaMA-Factory 0.9.5's pretraining examples (stage pt), built from a shard split that holds the
// merged datasets' documents in order (named_datasets.h writes it: per dataset the first
// max_samples rows, the datasets in `dataset:` order, each document `text` + EOS without BOS).
// docs/llamafactory.md gives the file:line of every rule followed here, and
// tests/python/test_lf_parity.py checks the result token for token against LLaMA-Factory itself.
//
//  1. The split is of *documents*, before any packing (llamafactory/data/data_utils.py
//     split_dataset -> datasets' Dataset.train_test_split(test_size, seed)): a fraction val_size
//     in (0, 1) holds out ceil(val_size x n) documents; a count (an integer written in the YAML,
//     or a number above 1, truncated) holds out that many. The permutation is numpy's
//     default_rng(seed).permutation(n) (numpy_random.h): eval = its first n_test entries, train
//     = the rest, both in permutation order, so the train documents are shuffled by the split.
//     Without val_size the documents keep their order and nothing is held out.
//  2. Each split is then cut into `workers` contiguous shards (preprocessing_num_workers; datasets'
//     Dataset.shard(contiguous=True), capped at the number of documents) and each shard into map
//     batches of `batch_documents` documents (preprocessing_batch_size) from its start.
//  3. Packing (the pt default): within one map batch the documents are concatenated and cut into
//     blocks of `block_len` tokens; the batch's tail shorter than a block is dropped. Blocks cross
//     document boundaries; a long document spans several blocks. (A YAML that writes
//     `packing: true` gets block_len = cutoff_len - 1: LLaMA-Factory's DataArguments quirk, which
//     the caller applies.) Without packing (`packing: false` written out), every document is an
//     example of its own, truncated to block_len tokens (a longer one loses its tail and its EOS).
//
// An example is described by where it starts in the split's document order (the index of its
// first document there and the offset within that document) and its length, so the table costs
// 24 bytes per example plus 8 per document of the split, and no token is copied.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::data {

// The split's held-out documents. Throws std::invalid_argument with LLaMA-Factory's (datasets')
// rule in the message when val_size does not fit: a fraction must be in (0, 1), a count in
// [1, n - 1].
struct DocumentSplit {
  std::vector<int64_t> train, eval;  // document indices, in the order they are packed
};
// val_size <= 0: no split (train = 0..n-1). `count`: val_size was written as an integer (YAML
// `val_size: 20`), which datasets takes as a number of documents even when it is 1.
DocumentSplit split_documents(int64_t num_documents, double val_size, bool count, uint64_t seed);

struct PackOptions {
  int64_t block_len = 1024;  // tokens per block (packing) or the truncation length (no packing)
  bool packing = true;
  int64_t batch_documents = 1000;  // preprocessing_batch_size
  int64_t workers = 1;             // preprocessing_num_workers (<= 1: one shard)
};

class ExampleTable {
 public:
  // `order`: the split's documents in packing order; `doc_starts`: the token stream's document
  // offsets (TokenSplit::document_starts(), documents + 1 entries). Throws std::invalid_argument
  // for a bad option or a document index outside the stream.
  static std::shared_ptr<const ExampleTable> build(std::vector<int64_t> order, const std::vector<int64_t>& doc_starts,
                                                   const PackOptions& options);
  int64_t num_examples() const { return static_cast<int64_t>(length_.size()); }
  int64_t length(int64_t example) const { return length_[example]; }
  int64_t max_length() const { return max_length_; }
  int64_t total_tokens() const { return total_tokens_; }
  // Tokens of the table's documents that no example covers (packing: each map batch's tail;
  // truncation: each long document's tail).
  int64_t dropped_tokens() const { return dropped_tokens_; }
  bool fixed_length() const { return fixed_; }  // packed: every example is block_len long
  // The stream ranges [offset, offset + count) that make up `example`, in order, one per
  // document; `doc_starts` is the one the table was built with.
  struct Piece {
    int64_t offset, count;
  };
  std::vector<Piece> pieces(int64_t example, const std::vector<int64_t>& doc_starts) const;
  // Examples [first, first + count) as a table of their own.
  std::shared_ptr<const ExampleTable> range(int64_t first, int64_t count) const;

 private:
  std::shared_ptr<const std::vector<int64_t>> order_;
  std::vector<int64_t> first_doc_;  // position in order_ of the example's first document
  std::vector<int64_t> first_offset_;
  std::vector<int64_t> length_;
  int64_t max_length_ = 0, total_tokens_ = 0, dropped_tokens_ = 0;
  bool fixed_ = true;
};

}  // namespace kiln::data
