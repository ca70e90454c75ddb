// Packed pretraining examples and the batch loader.
//
// Packing follows LLaMA-Factory's pretraining stage: the split's documents (each already ending
// in EOS) are one concatenated token stream, cut into blocks of exactly cutoff_len tokens; the
// tail that does not fill a whole block is dropped, so "Num examples" = floor(tokens /
// cutoff_len). labels = input_ids: the model shifts internally, so a block yields cutoff_len - 1
// next-token targets and no cutoff_len + 1-th token is read (the first token of the next block is
// never a target of this one). Blocks cross document boundaries; the optional segment ids
// (document index within the block, from 0) let attention keep documents apart.
//
// The loader shuffles block indices per epoch with its own Fisher-Yates over SplitMix64 seeded
// by (seed, epoch), so the order is identical on every platform and library version, and shards
// ranks like torch's DistributedSampler: pad the permutation to a multiple of world_size by
// wrapping around, rank r takes every world_size-th index from r. Batches per epoch per rank =
// ceil(ceil(blocks / world) / batch) = ceil(blocks / (batch * world)) as in HF Trainer; the last
// batch of an epoch may be smaller. LoaderState (epoch, batches consumed) is all a checkpoint
// needs to restore the exact next batch. A background thread prepares batches ahead, in pinned
// memory when CUDA is present.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kiln/data/lf_examples.h"
#include "kiln/data/shards.h"

namespace kiln::data {

class PackedDataset {
 public:
  // Blocks [first_block, first_block + num_blocks) of the split's packing (num_blocks -1 = all
  // from first_block): a contiguous range, e.g. to hold out the last blocks for validation.
  PackedDataset(std::shared_ptr<const TokenSplit> split, int64_t cutoff_len, int64_t first_block = 0,
                int64_t num_blocks = -1);
  // The listed blocks of the split's packing, in this order (e.g. a random validation split).
  PackedDataset(std::shared_ptr<const TokenSplit> split, int64_t cutoff_len, std::vector<int64_t> blocks);
  // LLaMA-Factory's examples of the split's documents (lf_examples.h): packed blocks, or
  // truncated documents of different lengths.
  PackedDataset(std::shared_ptr<const TokenSplit> split, std::shared_ptr<const ExampleTable> examples);
  int64_t num_blocks() const { return blocks_; }  // "Num examples"
  // The block length; for examples of different lengths, the longest.
  int64_t cutoff_len() const { return cutoff_len_; }
  bool fixed_length() const { return !examples_ || examples_->fixed_length(); }
  int64_t example_length(int64_t index) const { return examples_ ? examples_->length(index) : cutoff_len_; }
  // Tokens of the split that no block of its full packing covers (the dropped tail); for an
  // example table, those of its documents that no example covers.
  int64_t dropped_tokens() const {
    return examples_ ? examples_->dropped_tokens() : split_->num_tokens() % cutoff_len_;
  }
  // ids[0..example_length(index)) = example `index`; segments (optional) = document index within it.
  void read_block(int64_t index, int64_t* ids, int32_t* segments = nullptr) const;
  // Blocks [first, first + count) of this dataset as a dataset of their own (count >= 1).
  std::shared_ptr<PackedDataset> range(int64_t first, int64_t count) const;

 private:
  std::shared_ptr<const TokenSplit> split_;
  int64_t cutoff_len_, first_block_, blocks_;
  std::vector<int64_t> map_;                      // non-empty: block i is map_[i] of the split's packing
  std::shared_ptr<const ExampleTable> examples_;  // set: example i is its example i
};

// LLaMA-Factory's val_size split of n packed examples: `held_out` of them chosen at random by
// `seed` (the first held_out of a Fisher-Yates permutation over SplitMix64; not numpy's
// generator, so not the same blocks as LLaMA-Factory's), the rest for training; both sorted.
// Returns {train, held out}.
std::pair<std::vector<int64_t>, std::vector<int64_t>> random_split(int64_t n, int64_t held_out, uint64_t seed);

struct LoaderOptions {
  int64_t batch_size = 1;  // per rank
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t rank = 0, world_size = 1;
  // Also produce Batch::segment_ids (document-boundary mask input, "neat packing"); then the
  // labels of each document's first token in a block are -100.
  bool segment_ids = false;
  int prefetch = 2;        // batches prepared ahead by the background thread; 0 = none
  bool pin_memory = true;  // only takes effect when CUDA is present
  // LLaMA-Factory's collator (transformers' DataCollatorForLanguageModeling with pad = EOS): every
  // token equal to this id gets label -100 (>= 0; -1 = every token is a label).
  int64_t ignore_label_id = -1;
  // Rows shorter than the batch's longest example (no packing) are padded on the right with this
  // id, labels -100.
  int64_t pad_id = 0;
  // The epoch order: kKiln, kiln's own Fisher-Yates over SplitMix64 (the same on every platform
  // and library version), or kTorchRandperm, HF Trainer's sampler (accelerate's
  // SeedableRandomSampler: torch.randperm(n) from a CPU generator seeded with seed + epoch; with
  // LibTorch's own generator, so the same blocks in the same order as LLaMA-Factory).
  enum class Order { kKiln, kTorchRandperm };
  Order order = Order::kKiln;
};

// Where the loader is: the next batch is batch `position` of epoch `epoch`. The other fields
// describe the run it belongs to and are checked when it is restored.
struct LoaderState {
  int64_t epoch = 0, position = 0;
  uint64_t seed = 0;
  int64_t num_blocks = 0, batch_size = 0, world_size = 0, rank = 0;
  bool shuffle = true;
  std::string order = "kiln";  // LoaderOptions::order: "kiln" or "torch_randperm"; "stream": a StreamLoader's
  // A StreamLoader's stream (stream_dataset.h, StreamSpec::describe), "" for a DataLoader (and
  // absent from its JSON).
  std::string stream;
  std::string to_json() const;
  // Throws io::InputError naming `file` and the field.
  static LoaderState from_json(const std::string& text, const std::string& file = "loader state");
};

struct Batch {
  at::Tensor input_ids;             // [B, cutoff_len] int64
  at::Tensor labels;                // [B, cutoff_len] int64, = input_ids (the model shifts) or -100 where ignored
  at::Tensor segment_ids;           // [B, cutoff_len] int32 document index within each row; undefined unless asked
  std::vector<int64_t> blocks;      // the block index of each row
  int64_t epoch = 0, position = 0;  // which batch this is
};

// One row of a batch: example `index` of `set`.
struct BatchRow {
  const PackedDataset* set;
  int64_t index;
};

// `rows` as one batch, as the loader collates it (transformers' collator for LLaMA-Factory's
// datasets): rows padded on the right to the longest with options.pad_id (labels -100 there),
// labels -100 at options.ignore_label_id, segment ids and neat packing's first-token rule when
// options.segment_ids. Batch::blocks holds each row's index; epoch and position are left 0.
Batch collate(const std::vector<BatchRow>& rows, const LoaderOptions& options);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const PackedDataset> dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  Batch next();                            // the batch at state(), then advances (epochs roll over)
  LoaderState state() const;               // save in checkpoints
  void restore(const LoaderState& state);  // the next next() returns exactly the saved batch
  int64_t num_examples() const { return dataset_->num_blocks(); }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t samples_per_rank() const { return samples_per_rank_; }
  // Block indices of one rank's epoch, in order (exposed for tests and tools).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  Batch make_batch(int64_t epoch, int64_t position, const std::vector<int64_t>& order) const;
  void start_worker();
  void stop_worker();
  struct Worker;
  std::shared_ptr<const PackedDataset> dataset_;
  LoaderOptions options_;
  int64_t samples_per_rank_, batches_per_epoch_;
  int64_t epoch_ = 0, position_ = 0;
  std::unique_ptr<Worker> worker_;
};

}  // namespace kiln::data
