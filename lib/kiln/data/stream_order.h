// The order of documents LLaMA-Factory 0.9.5 streams with `streaming: true` over local files, as a
// function of the document counts alone, drawn lazily in O(buffer_size + datasets + num_shards)
// memory. "ds/" below is HF datasets 4.0.0 (site-packages/datasets), "lf/" llamafactory 0.9.5;
// the golden orders are tests/python/fixtures/stream_orders.json, written by datasets itself
// (make_stream_orders.py). Documents are numbered as in mixture.h: dataset j's row r is
// offset_j + r, offset_j = the lengths of the datasets before it.
//
// The pipeline, in the order the steps apply:
//  1. lf/data/loader.py:140-143: a local dataset is loaded whole, then
//     to_iterable_dataset(num_shards=training_args.dataloader_num_workers) (ds/arrow_dataset.py:5358).
//     num_shards > rows is a ValueError (:5458). num_shards == 1: one shard, the whole dataset;
//     num_shards >= 2: contiguous shards (:5467-5473 -> Dataset.shard(contiguous=True), :4948-4953:
//     shard s holds rows [div*s + min(s, mod), + div + (s < mod)), div, mod = divmod(rows, W)).
//     num_shards == 0 (transformers' default dataloader_num_workers!) makes an empty shard list:
//     the iterable yields NOTHING (ds/utils/sharding.py:4 still counts max(1, 0) = 1 shard, whose
//     list is empty), and LLaMA-Factory then dies in align_dataset's next(iter(dataset))
//     (lf/data/converter.py:410) with a bare StopIteration (with several datasets datasets' own
//     concatenate_datasets / interleave_datasets would raise it too, in _resolve_features). Here
//     num_shards 0 is an empty stream; refusing it as LLaMA-Factory does is the caller's choice.
//  2. align_dataset: a map, one row in, one row out (order kept).
//  3. lf/data/data_utils.py:51-80 merge_dataset: one dataset is returned as it is (any strategy);
//     concat -> concatenate_datasets (VerticallyConcatenatedMultiSourcesExamplesIterable);
//     interleave_* -> interleave_datasets(probabilities, seed, first_exhausted | all_exhausted):
//     CyclingMultiSourcesExamplesIterable without probabilities, RandomlyCycling... with them
//     (ds/iterable_dataset.py:4351-4416). interleave_once (all_exhausted_without_replacement) is
//     refused by ds/combine.py:146 for iterable datasets too (parse_mix_strategy says so).
//  4. lf/data/data_utils.py:107 dataset.shuffle(buffer_size, seed) (ds/iterable_dataset.py:2813:
//     generator G = np.random.default_rng(seed), BufferShuffledExamplesIterable), then with
//     val_size > 0 (an integer in streaming, lf/hparams/data_args.py:176): eval =
//     take(int(val_size)), train = skip(int(val_size)) of that same shuffled stream (:111-112).
//  5. Each epoch the Trainer calls set_epoch(epoch) on the train DataLoader (transformers
//     trainer.py:1688), accelerate passes it to the dataset (accelerate data_loader.py:603-619,
//     928-935), and its __iter__ sets the same number again (:563, :854). The eval DataLoader is
//     made afresh for each evaluation (trainer.py:898-921), whose iteration counter starts at 0:
//     eval is always epoch 0's first val_size documents. Only with dataloader_persistent_workers
//     does the Trainer keep it (:998-1002), and then evaluation m (from 0) runs at epoch m, the
//     counter accelerate's __iter__ advances after each full pass (:591, :925).
//
// The rules, all from one generator per iteration (the effective generator E):
//  * E (ds/iterable_dataset.py:2193 _effective_generator): epoch 0: G itself, i.e.
//    default_rng(seed). Epoch e >= 1: x = default_rng(seed).integers(0, 1 << 63) - e, E =
//    default_rng(x); were x negative datasets would add 1 << 63 to an np.int64, which raises
//    OverflowError under numpy 2 (a 1-in-2^63/e chance; an error here too).
//  * Every consumer starts from a fresh copy of E's state (each deep-copies it), so the draws
//    below are separate streams that all begin at default_rng(seed) (or default_rng(x)):
//    - shard order (ShuffledDataSourcesArrowExamplesIterable, :386 -> ds/utils/sharding.py:76
//      _shuffle_gen_kwargs): the shard list [0..W) Fisher-Yates shuffled (Generator.shuffle of a
//      list, numpy_shuffle); every dataset has W shards, so all get the same permutation P. A
//      dataset is read shard P[0], then P[1], ..., each shard's rows in order.
//    - concat's dataset order (:824 Vertically...shuffle_data_sources): the list of datasets
//      shuffled the same way (its own copy of E), so concat chains whole datasets in a random
//      order ("the samples between different datasets will not be mixed in streaming mode").
//    - interleave with probabilities (:996): RandomlyCycling's own generator (from
//      interleave_datasets' seed) is REPLACED by E, and the source of each next document is
//      E.choice(k, size=1000, p) (:956-983), 1000 draws at a time.
//    - the shuffle buffer (:1548-1566): slots drawn as E.integers(0, B, size=1000) 1000 at a
//      time (numpy_integers); the first B documents fill the buffer, each later document takes
//      the slot drawn, whose document is yielded; at the end the buffer (all of it, in slot order)
//      is shuffled with that same generator (numpy_shuffle, after however many 1000-batches were
//      drawn) and yielded.
//  * Interleaving (CyclingMultiSourcesExamplesIterable.__iter__, :711-751), per source index i
//    drawn (0, 1, .., k-1, 0, .. without probabilities; choice with them): stop if any
//    (first_exhausted) / all (all_exhausted) sources are marked exhausted; else yield the
//    source's next document and look one ahead: a source whose look-ahead finds its end is marked
//    exhausted and restarted from its first document (same shard order). So first_exhausted ends
//    right after the last document of the first source to run out (not after a full round, as
//    the map-style interleave does: lengths {2, 3} give a0 b0 a1, not a0 b0 a1 b1), and
//    all_exhausted after the last document of the last one. A source with probability 0 is never
//    drawn, so with all_exhausted it is never exhausted and the stream never ends (as in
//    datasets; next() keeps yielding).
//  * take / skip (:1712, :1588) are built after the shuffle, so they see the shuffled stream
//    (block_sources_order_when_shuffling is False for a shuffled dataset and passes the shuffle
//    through).
//
// DataLoader workers (dataloader_num_workers = N > 0, which LLaMA-Factory needs, see 1.): each
// worker w iterates _iter_pytorch (:2214): the pipeline above with E, then
// shard_data_sources(N, w, contiguous=False): every dataset keeps the shuffled shard positions w,
// w+N, .. (i.e. shards P[w], P[w+N], ..; with num_shards == N exactly shard P[w]); the buffer and
// the interleave draws start from E in every worker alike; take/skip keep/drop
// split_number(val_size, N)[w] = val_size/N (+1 for w < val_size % N) documents of the worker's
// own stream (:1626, :1646, :1771). A worker with no shard yields nothing. torch's DataLoader
// then returns the workers' batches in turn (worker 0's first batch, worker 1's, ..), leaving out
// a worker once it is exhausted (torch/utils/data/dataloader.py:1277 _worker_queue_idx_cycle,
// :1487-1562): a round robin of whole batches, where in LLaMA-Factory a batch is
// per_device_train_batch_size packed sequences built from that worker's documents.
//
// stream_dataset.h builds LLaMA-Factory's examples and the DataLoader's batches on it (a
// StreamOrder per worker; eval_dataset: is a second stream, shuffled the same way,
// lf/data/data_utils.py:127; a resumed run makes the epoch's orders again and skips). Not
// covered: several processes (accelerate's dispatch_batches / IterableDatasetShard).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/data/mixture.h"
#include "kiln/data/numpy_random.h"

namespace kiln::data {

// Which part of the shuffled stream: all of it (val_size 0), eval = take(val_size), train =
// skip(val_size).
enum class StreamPart { kAll, kEval, kTrain };

struct StreamOrderOptions {
  std::vector<int64_t> lengths;  // documents per dataset, in `dataset:` order
  int64_t num_shards = 0;        // to_iterable_dataset(num_shards=dataloader_num_workers)
  MixStrategy strategy = MixStrategy::kConcat;
  std::vector<double> probabilities;  // interleave_probs; empty = none
  uint64_t seed = 42;                 // training seed (shuffle's and interleave's)
  int64_t buffer_size = 16384;        // data_args.buffer_size
  int64_t epoch = 0;                  // set_epoch
  StreamPart part = StreamPart::kAll;
  int64_t val_size = 0;     // int(val_size), for kEval / kTrain
  int64_t num_workers = 0;  // 0: iterated in this process; N > 0: DataLoader worker
  int64_t worker = 0;       // .. `worker` of N
};

// The seed of the epoch's generator: `seed` for epoch 0, else default_rng(seed).integers(0, 1 <<
// 63) - epoch (std::overflow_error where datasets raises OverflowError).
uint64_t stream_epoch_seed(uint64_t seed, int64_t epoch);

class StreamOrder {
 public:
  // std::invalid_argument, in datasets' or LLaMA-Factory's words where they have them, for: no
  // datasets, a negative length, num_shards < 0 or > a dataset's length, buffer_size < 1,
  // probabilities with concat or of the wrong count or not a distribution, val_size < 0, a worker
  // out of range; and for interleave_over with probabilities where every source with a non-zero
  // probability is empty while one with probability 0 is not (datasets loops forever there
  // without yielding).
  explicit StreamOrder(StreamOrderOptions options);

  // The next document (its global index), or -1 at the end (and after it).
  int64_t next();

  const StreamOrderOptions& options() const { return opt_; }
  // Documents held in the shuffle buffer now (at most buffer_size): all the state that grows
  // with the data, the rest being O(datasets + num_shards).
  int64_t buffered() const { return static_cast<int64_t>(buffer_.size()); }

 private:
  struct Source {
    int64_t offset = 0;        // global index of the dataset's row 0
    int64_t length = 0;        // its rows
    size_t shard = 0;          // position in shards_ being read
    int64_t row = 0, end = 0;  // rows [row, end) left of the shard before it
  };

  int64_t pull(size_t j);  // source j's next document, -1 at its end
  void restart(size_t j);
  int64_t merged_next();  // the merge's next document, -1 at its end
  int64_t interleave_next();
  size_t next_source_index();
  int64_t shuffled_next();  // the buffer's next document, -1 at its end

  StreamOrderOptions opt_;
  uint64_t epoch_seed_ = 0;      // E = default_rng(epoch_seed_)
  std::vector<int64_t> shards_;  // the shard indices this process reads, in order
  std::vector<Source> sources_;

  // concat: the datasets' order and the one being read.
  std::vector<int64_t> concat_order_;
  size_t concat_pos_ = 0;

  // interleave: look-ahead per source (-2 none, -1 end), exhausted marks, the source draws.
  std::vector<int64_t> lookahead_;
  std::vector<bool> exhausted_;
  size_t cycle_ = 0;
  NumpyPcg64 choice_rng_;
  std::vector<int64_t> choice_batch_;
  size_t choice_pos_ = 0;
  bool merge_done_ = false;

  // the shuffle buffer.
  NumpyPcg64 buffer_rng_;
  std::vector<int64_t> buffer_;
  std::vector<int64_t> slot_batch_;
  size_t slot_pos_ = 0;
  bool draining_ = false;
  size_t drain_pos_ = 0;

  // take / skip.
  int64_t to_skip_ = 0;
  int64_t to_take_ = -1;  // -1: no limit
};

}  // namespace kiln::data
