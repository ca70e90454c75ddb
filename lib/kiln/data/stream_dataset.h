// LLaMA-Factory 0.9.5's streamed examples and batches (`streaming: true` over local files), made
// as the run reads them. The documents are the shard folder of named_datasets.h (tokenized once,
// memory-mapped); their order is StreamOrder's (stream_order.h: shards, the shard shuffle, concat
// or the iterable interleave, the shuffle buffer, take/skip, the epoch's seed, the DataLoader
// worker's share), and each worker packs its own documents per map batch exactly as the
// non-streaming path does (ExampleTable::build, lf_examples.h; one code path). docs/llamafactory.md
// section 6 gives the rules with their file:line, tests/python/test_lf_parity.py compares the
// batches with LLaMA-Factory's own DataLoader.
//
//  * Each torch DataLoader worker w of N = dataloader_num_workers runs the whole pipeline over its
//    shard (datasets' _iter_pytorch): its documents, then `map(batched=True,
//    batch_size=preprocessing_batch_size)` (lf/data/loader.py:255-261; no num_proc when streaming,
//    :247-253), so a map batch holds up to preprocessing_batch_size of the worker's documents and
//    the tail of each map batch shorter than a block is dropped; then batches of batch_size of the
//    worker's examples, the worker's last batch shorter (drop_last is False for an iterable).
//  * The DataLoader returns the workers' batches in turn, 0, 1, .., N-1, 0, .., leaving a worker
//    out once it is exhausted (torch/utils/data/dataloader.py _worker_queue_idx_cycle and
//    _next_data: a task given to an exhausted worker is skipped), until all are.
//  * Epoch e iterates the stream with set_epoch(e) (transformers trainer.py:1688, accelerate's
//    DataLoaderDispatcher.__iter__ -> dataset.set_epoch): a new shard order, buffer and interleave
//    draws from datasets' effective seed for e. An evaluation reads epoch 0 (a fresh DataLoader).
//
// Memory: per worker the shuffle buffer (at most buffer_size document indices), one map batch's
// example table (24 bytes per example + 8 per document of up to preprocessing_batch_size
// documents) and the batch being collated: O(N x (buffer_size + preprocessing_batch_size)),
// whatever the size of the files. The shard folder's document index (8 bytes per document) is
// what TokenSplit holds for any run.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/data/lf_examples.h"
#include "kiln/data/loader.h"
#include "kiln/data/stream_order.h"

namespace kiln::data {

// What a stream is made of.
struct StreamSpec {
  std::shared_ptr<const TokenSplit> documents;  // the merged datasets' documents, dataset after dataset
  // lengths, num_shards (= dataloader_num_workers), strategy, probabilities, seed, buffer_size,
  // part and val_size; epoch, num_workers and worker are set for each worker of each epoch.
  StreamOrderOptions order;
  PackOptions pack;       // block_len, packing, batch_documents (workers: unused, no num_proc when streaming)
  LoaderOptions batches;  // batch_size, pad_id, ignore_label_id, segment_ids, pin_memory
  // The settings that make the stream, for a checkpoint's loader state: a resume on another
  // stream is refused (LoaderState::stream).
  std::string describe() const;
};

// An example of a stream: `index` of its map batch's examples (kept alive while the row is).
struct StreamRow {
  std::shared_ptr<const PackedDataset> set;
  int64_t index = 0;
};

// One DataLoader worker's examples in one epoch: its documents in StreamOrder's order, packed per
// map batch of pack.batch_documents documents.
class StreamExamples {
 public:
  // `order` with epoch, num_workers and worker set. Throws std::invalid_argument as StreamOrder.
  StreamExamples(std::shared_ptr<const TokenSplit> documents, const StreamOrderOptions& order, const PackOptions& pack);
  // The next example, or nullopt at the end of the worker's stream (and after it).
  std::optional<StreamRow> next();
  // Document indices held now: the shuffle buffer and the current map batch.
  int64_t held_documents() const;
  int64_t documents_read() const { return documents_read_; }

 private:
  std::shared_ptr<const TokenSplit> documents_;
  StreamOrder order_;
  PackOptions pack_;
  std::shared_ptr<const PackedDataset> batch_;  // the current map batch's examples
  int64_t batch_documents_ = 0;
  int64_t next_ = 0;
  int64_t documents_read_ = 0;
  bool done_ = false;
};

// The batches of a torch DataLoader with dataloader_num_workers workers over the stream, epoch
// after epoch.
class StreamLoader {
 public:
  // At the start of epoch `epoch`. Throws std::invalid_argument for a bad spec (StreamOrder's
  // words, or num_shards 0: the empty stream of LLaMA-Factory's default dataloader_num_workers).
  explicit StreamLoader(StreamSpec spec, int64_t epoch = 0);

  // The epoch's next batch; nullopt when its stream is exhausted, after which the next call
  // starts the next epoch. An epoch that yields no batch at all is a std::runtime_error (accelerate
  // fails there too: "Batch does not contain any data").
  std::optional<Batch> next();
  // epoch = the epoch being read, position = its batches returned; after an epoch's end, the
  // next epoch at position 0.
  LoaderState state() const;
  // Continues exactly where `state` was: the epoch's stream made again and `position` batches
  // skipped (their examples are packed, no token is read): O(documents skipped) time, the same
  // memory as reading. std::runtime_error when the state is of another stream or past the
  // epoch's end.
  void restore(const LoaderState& state);
  // Epoch `epoch`'s stream made again with up to `batches` of its batches skipped (no token
  // read); false when it ended first (the next call then starts the next epoch), as transformers'
  // skip_first_batches leaves an epoch that has fewer.
  bool fast_forward(int64_t epoch, int64_t batches);
  int64_t epoch() const { return ended_ ? epoch_ + 1 : epoch_; }
  int64_t position() const { return ended_ ? 0 : position_; }
  const StreamSpec& spec() const { return spec_; }
  // Document indices held by all workers (shuffle buffers and map batches): bounded by
  // workers x (buffer_size + preprocessing_batch_size), for the memory test.
  int64_t held_documents() const;

 private:
  void start_epoch(int64_t epoch);
  std::vector<StreamRow> next_rows();  // the next batch's rows in the workers' turn; empty at the epoch's end
  std::optional<std::vector<StreamRow>> advance();

  StreamSpec spec_;
  std::vector<StreamExamples> workers_;
  std::vector<bool> active_;
  size_t turn_ = 0;
  int64_t epoch_ = 0, position_ = 0;
  bool ended_ = false;
};

// One optimizer step of transformers 5.6's Trainer over an iterable train set with max_steps
// (trainer.py _inner_training_loop, _run_epoch, set_initial_training_values): the dataset has no
// length, so steps_in_epoch = max_steps x accumulation and every window takes `accumulation`
// batches from the epoch's start (get_batch_samples, :2095-2101). A window cut short by the end of
// the epoch's stream makes no optimizer step (do_sync_step, :1720, is false for it): its forward
// and backward run, each batch's loss normalised by that window's num_items_in_batch, and the
// gradients stay, so they join the next epoch's first full window in one optimizer step (the
// epoch's remaining update steps find no batch; the next epoch starts with set_epoch(e + 1)).
struct StreamStep {
  std::vector<Batch> batches;         // in order: the carried windows' batches, then the full window's
  std::vector<int64_t> window_items;  // per batch: its window's labels that are not -100 (num_items_in_batch)
  int64_t windows = 0;                // windows joined (1 unless an epoch ended inside the step)
};
StreamStep next_stream_step(StreamLoader& loader, int64_t accumulation);

// HF's state.epoch after a step that left `loader` at epoch e, position p: e + p / (max_steps x
// accumulation) (trainer.py:1776 with steps_in_epoch = max_steps x accumulation).
double stream_epoch_progress(const StreamLoader& loader, int64_t max_steps, int64_t accumulation);

}  // namespace kiln::data
