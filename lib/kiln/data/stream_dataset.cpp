// LLaMA-Factory's streamed examples and the DataLoader's batches over them: see stream_dataset.h.
#include "kiln/data/stream_dataset.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln::data {

std::string StreamSpec::describe() const {
  const char* strategy = order.strategy == MixStrategy::kConcat            ? "concat"
                         : order.strategy == MixStrategy::kInterleaveUnder ? "interleave_under"
                                                                           : "interleave_over";
  const char* part = order.part == StreamPart::kAll ? "all" : order.part == StreamPart::kEval ? "eval" : "train";
  return fmt::format(
      "documents {}; dataloader_num_workers {}; {}{}; seed {}; buffer_size {}; {} (val_size {}); "
      "{} {}; preprocessing_batch_size {}; batch {}",
      fmt::join(order.lengths, "+"), order.num_shards, strategy,
      order.probabilities.empty() ? "" : fmt::format(" {}", fmt::join(order.probabilities, ",")), order.seed,
      order.buffer_size, part, order.val_size, pack.packing ? "blocks of" : "truncated to", pack.block_len,
      pack.batch_documents, batches.batch_size);
}

StreamExamples::StreamExamples(std::shared_ptr<const TokenSplit> documents, const StreamOrderOptions& order,
                               const PackOptions& pack)
    : documents_(std::move(documents)), order_(order), pack_(pack) {
  pack_.workers = 1;  // a streamed map has no num_proc: one map over the worker's stream
  if (pack_.batch_documents < 1) {
    throw std::invalid_argument(fmt::format("preprocessing_batch_size must be >= 1, got {}", pack_.batch_documents));
  }
}

std::optional<StreamRow> StreamExamples::next() {
  while (!batch_ || next_ == batch_->num_blocks()) {
    batch_.reset();
    batch_documents_ = 0;
    if (done_) return std::nullopt;
    // The next map batch: up to batch_documents of this worker's documents (MappedExamplesIterable,
    // batched, drop_last_batch False: the stream's last batch may be shorter).
    std::vector<int64_t> docs;
    docs.reserve(static_cast<size_t>(pack_.batch_documents));
    while (static_cast<int64_t>(docs.size()) < pack_.batch_documents) {
      const int64_t d = order_.next();
      if (d < 0) {
        done_ = true;
        break;
      }
      docs.push_back(d);
    }
    if (docs.empty()) return std::nullopt;
    documents_read_ += static_cast<int64_t>(docs.size());
    batch_documents_ = static_cast<int64_t>(docs.size());
    // The same packing as the non-streaming examples: one map batch of one shard.
    PackOptions one_batch = pack_;
    one_batch.batch_documents = batch_documents_;
    auto table = ExampleTable::build(std::move(docs), documents_->document_starts(), one_batch);
    if (table->num_examples() == 0) continue;  // a map batch shorter than a block packs into nothing
    batch_ = std::make_shared<PackedDataset>(documents_, std::move(table));
    next_ = 0;
  }
  return StreamRow{batch_, next_++};
}

int64_t StreamExamples::held_documents() const {
  return order_.buffered() + batch_documents_;
}

StreamLoader::StreamLoader(StreamSpec spec, int64_t epoch) : spec_(std::move(spec)) {
  if (!spec_.documents) throw std::invalid_argument("a stream needs its documents");
  if (spec_.order.num_shards < 1) {
    // to_iterable_dataset(num_shards=0) streams nothing (stream_order.h); LLaMA-Factory then fails.
    throw std::invalid_argument(fmt::format(
        "dataloader_num_workers {}: LLaMA-Factory streams local files in dataloader_num_workers shards, one per "
        "DataLoader worker, and with 0 the stream is empty (LLaMA-Factory 0.9.5 itself fails, StopIteration in "
        "align_dataset)",
        spec_.order.num_shards));
  }
  if (spec_.batches.batch_size < 1) throw std::invalid_argument("a stream's batch_size must be >= 1");
  start_epoch(epoch);
}

void StreamLoader::start_epoch(int64_t epoch) {
  const int64_t n = spec_.order.num_shards;  // LLaMA-Factory: num_shards = dataloader_num_workers = workers
  workers_.clear();
  workers_.reserve(static_cast<size_t>(n));
  for (int64_t w = 0; w < n; ++w) {
    StreamOrderOptions o = spec_.order;
    o.epoch = epoch;
    o.num_workers = n;
    o.worker = w;
    workers_.emplace_back(spec_.documents, o, spec_.pack);
  }
  active_.assign(static_cast<size_t>(n), true);
  turn_ = 0;
  epoch_ = epoch;
  position_ = 0;
  ended_ = false;
}

std::vector<StreamRow> StreamLoader::next_rows() {
  const size_t n = workers_.size();
  for (size_t tried = 0; tried < n; ++tried) {
    // The next worker in the cycle that is not exhausted (_try_put_index).
    while (!active_[turn_]) turn_ = (turn_ + 1) % n;
    StreamExamples& w = workers_[turn_];
    std::vector<StreamRow> rows;
    while (static_cast<int64_t>(rows.size()) < spec_.batches.batch_size) {
      std::optional<StreamRow> row = w.next();
      if (!row) break;
      rows.push_back(std::move(*row));
    }
    if (rows.empty()) {  // _IterableDatasetStopIteration: the worker is left out from now on
      active_[turn_] = false;
      if (std::none_of(active_.begin(), active_.end(), [](bool a) { return a; })) return {};
      continue;
    }
    turn_ = (turn_ + 1) % n;
    return rows;
  }
  return {};
}

std::optional<std::vector<StreamRow>> StreamLoader::advance() {
  if (ended_) start_epoch(epoch_ + 1);
  std::vector<StreamRow> rows = next_rows();
  if (rows.empty()) {
    if (position_ == 0) {
      throw std::runtime_error(fmt::format(
          "epoch {} of the stream ({}) yields no batch: its documents pack into no example in any DataLoader worker "
          "(LLaMA-Factory fails there too, accelerate's \"Batch does not contain any data\"): use more documents, "
          "a smaller cutoff_len or a larger preprocessing_batch_size",
          epoch_, spec_.describe()));
    }
    ended_ = true;
    return std::nullopt;
  }
  ++position_;
  return rows;
}

std::optional<Batch> StreamLoader::next() {
  const std::optional<std::vector<StreamRow>> rows = advance();
  if (!rows) return std::nullopt;
  std::vector<BatchRow> batch;
  batch.reserve(rows->size());
  for (const StreamRow& row : *rows) batch.push_back({row.set.get(), row.index});
  Batch b = collate(batch, spec_.batches);
  b.epoch = epoch_;
  b.position = position_ - 1;
  return b;
}

LoaderState StreamLoader::state() const {
  LoaderState s;
  s.epoch = epoch();
  s.position = position();
  s.seed = spec_.order.seed;
  s.num_blocks = 0;  // a stream has no length
  s.batch_size = spec_.batches.batch_size;
  s.world_size = 1;
  s.rank = 0;
  s.shuffle = true;
  s.order = "stream";
  s.stream = spec_.describe();
  return s;
}

void StreamLoader::restore(const LoaderState& s) {
  const LoaderState now = state();
  const auto mismatch = [](const char* field, const auto& saved, const auto& here) {
    return std::runtime_error(fmt::format(
        "loader state: {} was {} when saved but is {} now; the saved position does not apply to this stream", field,
        saved, here));
  };
  if (s.order != now.order) throw mismatch("order", s.order, now.order);
  if (s.stream != now.stream) throw mismatch("stream", s.stream, now.stream);
  if (s.seed != now.seed) throw mismatch("seed", s.seed, now.seed);
  if (s.batch_size != now.batch_size) throw mismatch("batch_size", s.batch_size, now.batch_size);
  if (s.world_size != now.world_size) throw mismatch("world_size", s.world_size, now.world_size);
  if (s.epoch < 0 || s.position < 0) {
    throw std::runtime_error(fmt::format("loader state: epoch {} position {} is negative", s.epoch, s.position));
  }
  if (!fast_forward(s.epoch, s.position)) {
    throw std::runtime_error(fmt::format("loader state: position {} of epoch {} is past the epoch's {} batches",
                                         s.position, s.epoch, position_));
  }
}

bool StreamLoader::fast_forward(int64_t epoch, int64_t batches) {
  start_epoch(epoch);
  for (int64_t i = 0; i < batches; ++i) {
    if (!advance()) return false;
  }
  return true;
}

int64_t StreamLoader::held_documents() const {
  int64_t n = 0;
  for (const StreamExamples& w : workers_) n += w.held_documents();
  return n;
}

StreamStep next_stream_step(StreamLoader& loader, int64_t accumulation) {
  if (accumulation < 1) throw std::invalid_argument("gradient_accumulation_steps must be >= 1");
  StreamStep step;
  for (;;) {
    const size_t first = step.batches.size();
    int64_t items = 0;
    while (static_cast<int64_t>(step.batches.size() - first) < accumulation) {
      std::optional<Batch> b = loader.next();
      if (!b) break;
      items += b->labels.ne(-100).sum().item<int64_t>();
      step.batches.push_back(std::move(*b));
    }
    const auto got = static_cast<int64_t>(step.batches.size() - first);
    step.window_items.resize(step.batches.size(), items);
    if (got > 0) ++step.windows;
    if (got == accumulation) return step;  // a full window: the optimizer step
    // The epoch's stream ended inside (or right at the start of) this window: the next epoch's
    // batches follow (StreamLoader::next starts it).
  }
}

double stream_epoch_progress(const StreamLoader& loader, int64_t max_steps, int64_t accumulation) {
  return static_cast<double>(loader.epoch()) +
         static_cast<double>(loader.position()) / static_cast<double>(max_steps * accumulation);
}

}  // namespace kiln::data
