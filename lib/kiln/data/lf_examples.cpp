// LLaMA-Factory's document split and per-map-batch packing: see lf_examples.h.
#include "kiln/data/lf_examples.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/data/numpy_random.h"

namespace kiln::data {

DocumentSplit split_documents(int64_t n, double val_size, bool count, uint64_t seed) {
  DocumentSplit s;
  if (!(val_size > 0)) {
    s.train.resize(n);
    std::iota(s.train.begin(), s.train.end(), int64_t{0});
    return s;
  }
  // LLaMA-Factory: val_size = int(val_size) if val_size > 1 else val_size; datasets then takes an
  // int as a count and a float as a fraction of the documents, rounded up.
  int64_t n_test = 0;
  if (count || val_size > 1) {
    n_test = static_cast<int64_t>(val_size);
    if (n_test <= 0 || n_test >= n) {
      throw std::invalid_argument(fmt::format(
          "holds out {} of the {} documents: a count of documents must be in [1, {}] (datasets' train_test_split)",
          n_test, n, n - 1));
    }
  } else {
    if (!(val_size < 1)) {
      throw std::invalid_argument(
          fmt::format("{} is neither a fraction in (0, 1) nor a count of documents written as an integer (datasets' "
                      "train_test_split refuses a test_size of 1.0)",
                      val_size));
    }
    n_test = static_cast<int64_t>(std::ceil(val_size * static_cast<double>(n)));
    if (n_test >= n) {
      throw std::invalid_argument(fmt::format("holds out {} of the {} documents; none is left to train on", n_test, n));
    }
  }
  const std::vector<int64_t> perm = numpy_permutation(seed, n);
  s.eval.assign(perm.begin(), perm.begin() + n_test);
  s.train.assign(perm.begin() + n_test, perm.end());
  return s;
}

std::shared_ptr<const ExampleTable> ExampleTable::build(std::vector<int64_t> order,
                                                        const std::vector<int64_t>& doc_starts,
                                                        const PackOptions& options) {
  if (options.block_len < 1) throw std::invalid_argument(fmt::format("block length {} < 1", options.block_len));
  if (options.batch_documents < 1) {
    throw std::invalid_argument(fmt::format("preprocessing_batch_size must be >= 1, got {}", options.batch_documents));
  }
  const int64_t num_docs = static_cast<int64_t>(doc_starts.size()) - 1;
  for (const int64_t d : order) {
    if (d < 0 || d >= num_docs)
      throw std::invalid_argument(fmt::format("document {} is outside the stream's {} documents", d, num_docs));
  }
  auto t = std::make_shared<ExampleTable>();
  const auto doc_len = [&](int64_t pos) { return doc_starts[order[pos] + 1] - doc_starts[order[pos]]; };
  const int64_t m = static_cast<int64_t>(order.size());
  const int64_t L = options.block_len;
  t->fixed_ = options.packing;
  if (!options.packing) {
    for (int64_t j = 0; j < m; ++j) {
      const int64_t len = std::min(doc_len(j), L);
      if (len == 0) continue;  // cannot happen for documents ending in EOS
      t->first_doc_.push_back(j);
      t->first_offset_.push_back(0);
      t->length_.push_back(len);
    }
  } else {
    // datasets' map(num_proc=k): contiguous shards, shard i = [div*i + min(i, mod), + div + (i < mod)).
    const int64_t k = std::max<int64_t>(1, std::min<int64_t>(options.workers, m));
    const int64_t div = m / k, mod = m % k;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t shard_begin = div * i + std::min(i, mod);
      const int64_t shard_end = shard_begin + div + (i < mod ? 1 : 0);
      for (int64_t b = shard_begin; b < shard_end; b += options.batch_documents) {
        const int64_t e = std::min(b + options.batch_documents, shard_end);
        int64_t total = 0;
        for (int64_t j = b; j < e; ++j) total += doc_len(j);
        int64_t j = b, off = 0;
        for (int64_t block = 0; block < total / L; ++block) {
          while (off == doc_len(j)) ++j, off = 0;
          t->first_doc_.push_back(j);
          t->first_offset_.push_back(off);
          t->length_.push_back(L);
          for (int64_t need = L; need > 0;) {  // advance by one block
            while (off == doc_len(j)) ++j, off = 0;
            const int64_t take = std::min(need, doc_len(j) - off);
            off += take;
            need -= take;
          }
        }
      }
    }
  }
  int64_t input_tokens = 0;
  for (int64_t j = 0; j < m; ++j) input_tokens += doc_len(j);
  for (const int64_t len : t->length_) {
    t->max_length_ = std::max(t->max_length_, len);
    t->total_tokens_ += len;
  }
  t->dropped_tokens_ = input_tokens - t->total_tokens_;
  t->order_ = std::make_shared<const std::vector<int64_t>>(std::move(order));
  return t;
}

std::vector<ExampleTable::Piece> ExampleTable::pieces(int64_t example, const std::vector<int64_t>& doc_starts) const {
  if (example < 0 || example >= num_examples())
    throw std::out_of_range(fmt::format("example {} outside [0, {})", example, num_examples()));
  std::vector<Piece> out;
  const auto& order = *order_;
  int64_t j = first_doc_[example], off = first_offset_[example];
  for (int64_t need = length_[example]; need > 0;) {
    const int64_t doc = order[j];
    const int64_t len = doc_starts[doc + 1] - doc_starts[doc];
    const int64_t take = std::min(need, len - off);
    if (take > 0) out.push_back({doc_starts[doc] + off, take});
    need -= take;
    ++j, off = 0;
  }
  return out;
}

std::shared_ptr<const ExampleTable> ExampleTable::range(int64_t first, int64_t count) const {
  if (first < 0 || count < 1 || first + count > num_examples()) {
    throw std::invalid_argument(fmt::format("examples [{}, {}) are not a non-empty range of the table's {}", first,
                                            first + count, num_examples()));
  }
  auto t = std::make_shared<ExampleTable>(*this);
  t->first_doc_.assign(first_doc_.begin() + first, first_doc_.begin() + first + count);
  t->first_offset_.assign(first_offset_.begin() + first, first_offset_.begin() + first + count);
  t->length_.assign(length_.begin() + first, length_.begin() + first + count);
  t->max_length_ = *std::max_element(t->length_.begin(), t->length_.end());
  t->total_tokens_ = std::accumulate(t->length_.begin(), t->length_.end(), int64_t{0});
  t->dropped_tokens_ = 0;  // a range covers only what it holds
  return t;
}

}  // namespace kiln::data
