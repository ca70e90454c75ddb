// LLaMA-Factory's streaming document order over local files (datasets' iterable pipeline): see
// stream_order.h for the rules and where in datasets 4.0.0 each comes from.
#include "kiln/data/stream_order.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace kiln::data {

namespace {

constexpr int64_t kRandomBatch = 1000;  // random_batch_size of both draws (iterable_dataset.py:1548, :959)
constexpr int64_t kNone = -2;           // no look-ahead held (CyclingMultiSources' nexts[i] is None)

// Dataset.shard(num_shards, index, contiguous=True) (arrow_dataset.py:4948-4953): rows [start, end).
std::pair<int64_t, int64_t> shard_rows(int64_t rows, int64_t num_shards, int64_t index) {
  const int64_t div = rows / num_shards, mod = rows % num_shards;
  const int64_t start = div * index + std::min(index, mod);
  return {start, start + div + (index < mod ? 1 : 0)};
}

// Take/SkipExamplesIterable.split_number(num, n)[index] (iterable_dataset.py:1626, :1751).
int64_t split_number(int64_t num, int64_t n, int64_t index) {
  return num / n + (index < num % n ? 1 : 0);
}

void validate(const StreamOrderOptions& o) {
  if (o.lengths.empty()) throw std::invalid_argument("Unable to concatenate an empty list of datasets.");
  if (o.num_shards < 0) {
    throw std::invalid_argument(fmt::format("num_shards (dataloader_num_workers) {} is negative", o.num_shards));
  }
  for (int64_t n : o.lengths) {
    if (n < 0) throw std::invalid_argument(fmt::format("a dataset of {} documents", n));
    // to_iterable_dataset (arrow_dataset.py:5458).
    if (o.num_shards > n) {
      throw std::invalid_argument(fmt::format(
          "Unable to shard a dataset of size {} into {} shards (the number of shards exceeds the number of samples).",
          n, o.num_shards));
    }
  }
  if (o.buffer_size < 1) {
    // BufferShuffledExamplesIterable would draw integers(0, buffer_size) at its first document.
    throw std::invalid_argument(fmt::format("buffer_size {}: high <= 0 (numpy's words)", o.buffer_size));
  }
  if (!o.probabilities.empty()) {
    // lf/hparams/data_args.py:165-171.
    if (o.strategy == MixStrategy::kConcat) {
      throw std::invalid_argument("`interleave_probs` is only valid for interleaved mixing.");
    }
    if (o.probabilities.size() != o.lengths.size()) {
      throw std::invalid_argument("The length of dataset and interleave probs should be identical.");
    }
    if (o.lengths.size() > 1) numpy_check_probabilities(o.probabilities);
  }
  if (o.val_size < 0) throw std::invalid_argument(fmt::format("val_size {} is negative", o.val_size));
  if (o.num_workers < 0 || (o.num_workers > 0 && (o.worker < 0 || o.worker >= o.num_workers))) {
    throw std::invalid_argument(fmt::format("worker {} of {} DataLoader workers", o.worker, o.num_workers));
  }
}

}  // namespace

uint64_t stream_epoch_seed(uint64_t seed, int64_t epoch) {
  if (epoch < 0) throw std::invalid_argument(fmt::format("epoch {} is negative", epoch));
  if (epoch == 0) return seed;  // _effective_generator returns the shuffle's own generator
  // iterable_dataset.py:2198-2200: deepcopy(generator).integers(0, 1 << 63) - epoch.
  NumpyPcg64 g(seed);
  const uint64_t x = numpy_bounded_uint64(g, (uint64_t{1} << 63) - 1);
  if (x < static_cast<uint64_t>(epoch)) {
    // (1 << 63) + <negative np.int64> does not fit an int64 under numpy 2.
    throw std::overflow_error(fmt::format(
        "Python int too large to convert to C long (datasets' effective seed for seed {} at epoch {})", seed, epoch));
  }
  return x - static_cast<uint64_t>(epoch);
}

StreamOrder::StreamOrder(StreamOrderOptions options)
    : opt_((validate(options), std::move(options))),
      epoch_seed_(stream_epoch_seed(opt_.seed, opt_.epoch)),
      choice_rng_(epoch_seed_),
      buffer_rng_(epoch_seed_) {
  const size_t k = opt_.lengths.size();
  const int64_t w = opt_.num_shards;

  // Shard order: _shuffle_gen_kwargs on a fresh copy of E; then this worker's positions
  // (split_shard_indices_by_worker contiguous=False: w, w + N, ..).
  std::vector<int64_t> perm(static_cast<size_t>(w));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  {
    NumpyPcg64 rng(epoch_seed_);
    numpy_shuffle(rng, perm);
  }
  if (opt_.num_workers == 0) {
    shards_ = std::move(perm);
  } else {
    for (int64_t p = opt_.worker; p < w; p += opt_.num_workers) shards_.push_back(perm[static_cast<size_t>(p)]);
  }

  sources_.resize(k);
  std::vector<int64_t> here(k, 0);  // documents each source has in this process
  int64_t offset = 0;
  for (size_t j = 0; j < k; ++j) {
    sources_[j].offset = offset;
    sources_[j].length = opt_.lengths[j];
    offset += opt_.lengths[j];
    for (int64_t s : shards_) {
      const auto [b, e] = shard_rows(opt_.lengths[j], w, s);
      here[j] += e - b;
    }
  }

  if (k > 1 && opt_.strategy == MixStrategy::kConcat) {
    concat_order_.resize(k);
    std::iota(concat_order_.begin(), concat_order_.end(), int64_t{0});
    NumpyPcg64 rng(epoch_seed_);
    numpy_shuffle(rng, concat_order_);
  }
  if (k > 1 && opt_.strategy != MixStrategy::kConcat) {
    lookahead_.assign(k, kNone);
    exhausted_.assign(k, false);
    if (opt_.strategy == MixStrategy::kInterleaveOver && !opt_.probabilities.empty()) {
      bool zero_open = false, drawn_any = false;
      for (size_t j = 0; j < k; ++j) {
        if (opt_.probabilities[j] == 0.0) zero_open = true;
        if (opt_.probabilities[j] > 0.0 && here[j] > 0) drawn_any = true;
      }
      if (zero_open && !drawn_any) {
        throw std::invalid_argument(
            "interleave_over with interleave_probs: every dataset with a non-zero probability is empty here and one "
            "with probability 0 is never drawn, so datasets would loop forever without yielding a document");
      }
    }
  }

  if (opt_.part != StreamPart::kAll) {
    const int64_t n =
        opt_.num_workers == 0 ? opt_.val_size : split_number(opt_.val_size, opt_.num_workers, opt_.worker);
    if (opt_.part == StreamPart::kEval) {
      to_take_ = n;
    } else {
      to_skip_ = n;
    }
  }
}

int64_t StreamOrder::pull(size_t j) {
  Source& s = sources_[j];
  while (s.row == s.end) {
    if (s.shard >= shards_.size()) return -1;
    const auto [b, e] = shard_rows(s.length, opt_.num_shards, shards_[s.shard++]);
    s.row = b;
    s.end = e;
  }
  return s.offset + s.row++;
}

void StreamOrder::restart(size_t j) {
  Source& s = sources_[j];
  s.shard = 0;
  s.row = s.end = 0;
}

size_t StreamOrder::next_source_index() {
  const size_t k = sources_.size();
  if (opt_.probabilities.empty()) {  // CyclingMultiSourcesExamplesIterable._get_indices_iterator
    const size_t i = cycle_;
    cycle_ = (cycle_ + 1) % k;
    return i;
  }
  // RandomlyCycling..._get_indices_iterator: choice(k, size=1000, p=probabilities) from E.
  if (choice_pos_ == choice_batch_.size()) {
    choice_batch_ = numpy_choice(choice_rng_, opt_.probabilities, kRandomBatch);
    choice_pos_ = 0;
  }
  return static_cast<size_t>(choice_batch_[choice_pos_++]);
}

int64_t StreamOrder::interleave_next() {
  // CyclingMultiSourcesExamplesIterable.__iter__ (iterable_dataset.py:711-751).
  const bool all = opt_.strategy == MixStrategy::kInterleaveOver;
  while (!merge_done_) {
    const size_t i = next_source_index();
    const bool stop = all ? std::all_of(exhausted_.begin(), exhausted_.end(), [](bool e) { return e; })
                          : std::any_of(exhausted_.begin(), exhausted_.end(), [](bool e) { return e; });
    if (stop) {
      merge_done_ = true;
      break;
    }
    if (lookahead_[i] == kNone) lookahead_[i] = pull(i);
    const int64_t result = lookahead_[i];
    lookahead_[i] = pull(i);
    if (lookahead_[i] == -1) {
      exhausted_[i] = true;
      lookahead_[i] = kNone;
      restart(i);
    }
    if (result != -1) return result;
  }
  return -1;
}

int64_t StreamOrder::merged_next() {
  const size_t k = sources_.size();
  if (k == 1) return pull(0);  // merge_dataset returns a single dataset as it is
  if (opt_.strategy != MixStrategy::kConcat) return interleave_next();
  while (concat_pos_ < concat_order_.size()) {
    const int64_t x = pull(static_cast<size_t>(concat_order_[concat_pos_]));
    if (x != -1) return x;
    ++concat_pos_;
  }
  return -1;
}

int64_t StreamOrder::shuffled_next() {
  // BufferShuffledExamplesIterable.__iter__ (iterable_dataset.py:1552-1567).
  if (!draining_) {
    const int64_t b = opt_.buffer_size;
    for (;;) {
      const int64_t x = merged_next();
      if (x == -1) {
        numpy_shuffle(buffer_rng_, buffer_);
        draining_ = true;
        break;
      }
      if (static_cast<int64_t>(buffer_.size()) == b) {
        if (slot_pos_ == slot_batch_.size()) {
          slot_batch_ = numpy_integers(buffer_rng_, 0, b, kRandomBatch);
          slot_pos_ = 0;
        }
        const auto slot = static_cast<size_t>(slot_batch_[slot_pos_++]);
        return std::exchange(buffer_[slot], x);
      }
      buffer_.push_back(x);
    }
  }
  return drain_pos_ < buffer_.size() ? buffer_[drain_pos_++] : -1;
}

int64_t StreamOrder::next() {
  while (to_skip_ > 0) {  // SkipExamplesIterable: islice(stream, n, None)
    --to_skip_;
    if (shuffled_next() == -1) {
      to_skip_ = 0;
      return -1;
    }
  }
  if (to_take_ == 0) return -1;  // TakeExamplesIterable: islice(stream, n)
  const int64_t x = shuffled_next();
  if (x != -1 && to_take_ > 0) --to_take_;
  return x;
}

}  // namespace kiln::data
