// PackedDataset and DataLoader: see loader.h for the packing, order and resume rules.
#include "kiln/data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/io/input_file.h"

namespace kiln::data {

PackedDataset::PackedDataset(std::shared_ptr<const TokenSplit> split, int64_t cutoff_len, int64_t first_block,
                             int64_t num_blocks)
    : split_(std::move(split)), cutoff_len_(cutoff_len), first_block_(first_block) {
  if (cutoff_len_ < 2) throw std::invalid_argument(fmt::format("cutoff_len must be >= 2, got {}", cutoff_len_));
  const int64_t total = split_->num_tokens() / cutoff_len_;
  if (total == 0) {
    throw std::invalid_argument(fmt::format("the split has {} tokens, fewer than one block of cutoff_len {}",
                                            split_->num_tokens(), cutoff_len_));
  }
  blocks_ = num_blocks < 0 ? total - first_block : num_blocks;
  if (first_block < 0 || blocks_ <= 0 || first_block + blocks_ > total) {
    throw std::invalid_argument(fmt::format("blocks [{}, {}) are not a non-empty range of the split's {} blocks",
                                            first_block, first_block + blocks_, total));
  }
}

PackedDataset::PackedDataset(std::shared_ptr<const TokenSplit> split, int64_t cutoff_len, std::vector<int64_t> blocks)
    : PackedDataset(std::move(split), cutoff_len) {
  for (const int64_t b : blocks) {
    if (b < 0 || b >= blocks_)
      throw std::invalid_argument(fmt::format("block {} is outside the split's {} blocks", b, blocks_));
  }
  if (blocks.empty()) throw std::invalid_argument("an empty list of blocks");
  blocks_ = static_cast<int64_t>(blocks.size());
  map_ = std::move(blocks);
}

PackedDataset::PackedDataset(std::shared_ptr<const TokenSplit> split, std::shared_ptr<const ExampleTable> examples)
    : split_(std::move(split)), first_block_(0), examples_(std::move(examples)) {
  if (!examples_ || examples_->num_examples() == 0) {
    // LLaMA-Factory's own words (llamafactory/data/loader.py): it fails the same way.
    throw std::invalid_argument("Cannot find sufficient samples, consider increasing dataset size.");
  }
  blocks_ = examples_->num_examples();
  cutoff_len_ = examples_->max_length();
}

std::shared_ptr<PackedDataset> PackedDataset::range(int64_t first, int64_t count) const {
  if (first < 0 || count < 1 || first + count > blocks_) {
    throw std::invalid_argument(fmt::format("blocks [{}, {}) are not a non-empty range of the dataset's {} blocks",
                                            first, first + count, blocks_));
  }
  if (examples_) return std::make_shared<PackedDataset>(split_, examples_->range(first, count));
  if (!map_.empty()) {
    return std::make_shared<PackedDataset>(split_, cutoff_len_,
                                           std::vector<int64_t>(map_.begin() + first, map_.begin() + first + count));
  }
  return std::make_shared<PackedDataset>(split_, cutoff_len_, first_block_ + first, count);
}

void PackedDataset::read_block(int64_t index, int64_t* ids, int32_t* segments) const {
  if (index < 0 || index >= blocks_) throw std::out_of_range(fmt::format("block {} outside [0, {})", index, blocks_));
  if (examples_) {
    int32_t segment = 0;
    for (const auto& piece : examples_->pieces(index, split_->document_starts())) {
      split_->copy_tokens(piece.offset, piece.count, ids);
      ids += piece.count;
      if (segments) segments = std::fill_n(segments, piece.count, segment++);
    }
    return;
  }
  const int64_t start = (map_.empty() ? first_block_ + index : map_[index]) * cutoff_len_;
  split_->copy_tokens(start, cutoff_len_, ids);
  if (segments) {
    const auto& starts = split_->document_starts();
    int64_t doc = split_->document_of(start);
    const int64_t first = doc;
    for (int64_t i = 0; i < cutoff_len_; ++i) {
      while (start + i >= starts[doc + 1]) ++doc;
      segments[i] = static_cast<int32_t>(doc - first);
    }
  }
}

std::string LoaderState::to_json() const {
  nlohmann::json j{{"epoch", epoch},
                   {"position", position},
                   {"seed", seed},
                   {"num_blocks", num_blocks},
                   {"batch_size", batch_size},
                   {"world_size", world_size},
                   {"rank", rank},
                   {"shuffle", shuffle},
                   {"order", order}};
  if (!stream.empty()) j["stream"] = stream;
  return j.dump();
}

LoaderState LoaderState::from_json(const std::string& text, const std::string& file) {
  constexpr int64_t kMax = int64_t{1} << 53;
  const nlohmann::json j = io::parse_json(text, file);
  const auto at = [&](const char* key) -> const nlohmann::json& { return io::json_field(j, key, file); };
  const auto integer = [&](const char* key, int64_t lo) { return io::json_integer(at(key), file, key, lo, kMax); };
  LoaderState s;
  s.epoch = integer("epoch", 0);
  s.position = integer("position", 0);
  s.seed = io::json_unsigned(at("seed"), file, "seed");
  s.num_blocks = integer("num_blocks", 0);
  s.batch_size = integer("batch_size", 1);
  s.world_size = integer("world_size", 1);
  s.rank = integer("rank", 0);
  s.shuffle = io::json_bool(at("shuffle"), file, "shuffle");
  // absent in states saved before it existed
  s.order = j.contains("order") ? io::json_string(j.at("order"), file, "order") : std::string("kiln");
  if (j.contains("stream")) s.stream = io::json_string(j.at("stream"), file, "stream");
  return s;
}

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection of the incomplete top range).
uint64_t uniform(uint64_t& state, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do x = splitmix64(state);
  while (x >= limit);
  return x % bound;
}

}  // namespace

std::pair<std::vector<int64_t>, std::vector<int64_t>> random_split(int64_t n, int64_t held_out, uint64_t seed) {
  if (held_out < 0 || held_out > n) throw std::invalid_argument(fmt::format("cannot hold out {} of {}", held_out, n));
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  uint64_t state = seed ^ 0x5EED5A1D5EED5A1DULL;  // a stream of its own, apart from the epochs' orders
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[uniform(state, static_cast<uint64_t>(i) + 1)]);
  std::vector<int64_t> val(perm.begin(), perm.begin() + held_out), train(perm.begin() + held_out, perm.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
  return {std::move(train), std::move(val)};
}

struct DataLoader::Worker {
  std::thread thread;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Batch> ready;
  std::exception_ptr error;
  bool stop = false;
};

DataLoader::DataLoader(std::shared_ptr<const PackedDataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  if (options_.batch_size <= 0) throw std::invalid_argument("loader: batch_size must be > 0");
  if (options_.world_size <= 0 || options_.rank < 0 || options_.rank >= options_.world_size)
    throw std::invalid_argument(
        fmt::format("loader: rank {} is outside world size {}", options_.rank, options_.world_size));
  const int64_t n = dataset_->num_blocks();
  samples_per_rank_ = (n + options_.world_size - 1) / options_.world_size;
  batches_per_epoch_ = (samples_per_rank_ + options_.batch_size - 1) / options_.batch_size;
  start_worker();
}

DataLoader::~DataLoader() {
  stop_worker();
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  const int64_t n = dataset_->num_blocks();
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  if (options_.shuffle && options_.order == LoaderOptions::Order::kTorchRandperm) {
    // torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)), as accelerate's
    // SeedableRandomSampler draws each epoch (accelerate/data_loader.py).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<uint64_t>(epoch));
    const at::Tensor p = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    std::copy_n(p.data_ptr<int64_t>(), n, perm.begin());
  } else if (options_.shuffle) {
    uint64_t state = options_.seed ^ (0xD1B54A32D192ED03ULL * static_cast<uint64_t>(epoch + 1));
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[uniform(state, static_cast<uint64_t>(i) + 1)]);
  }
  std::vector<int64_t> mine;
  mine.reserve(samples_per_rank_);
  for (int64_t k = 0; k < samples_per_rank_; ++k) mine.push_back(perm[(k * options_.world_size + options_.rank) % n]);
  return mine;
}

Batch collate(const std::vector<BatchRow>& rows_in, const LoaderOptions& options) {
  const int64_t rows = static_cast<int64_t>(rows_in.size());
  int64_t len = 0;  // padded to the batch's longest example, as transformers' collator
  for (const BatchRow& row : rows_in) len = std::max(len, row.set->example_length(row.index));
  const bool pin = options.pin_memory && at::globalContext().hasCUDA();
  Batch b;
  b.input_ids = at::empty({rows, len}, at::TensorOptions().dtype(at::kLong).pinned_memory(pin));
  if (options.segment_ids)
    b.segment_ids = at::empty({rows, len}, at::TensorOptions().dtype(at::kInt).pinned_memory(pin));
  std::vector<std::pair<int64_t, int64_t>> padding;  // (row, first padded column)
  for (int64_t r = 0; r < rows; ++r) {
    const BatchRow& row = rows_in[static_cast<size_t>(r)];
    b.blocks.push_back(row.index);
    int64_t* ids = b.input_ids.data_ptr<int64_t>() + r * len;
    int32_t* seg = options.segment_ids ? b.segment_ids.data_ptr<int32_t>() + r * len : nullptr;
    row.set->read_block(row.index, ids, seg);
    const int64_t have = row.set->example_length(row.index);
    if (have < len) {
      std::fill(ids + have, ids + len, options.pad_id);
      if (seg) std::fill(seg + have, seg + len, have > 0 ? seg[have - 1] + 1 : 0);
      padding.emplace_back(r, have);
    }
  }
  b.labels = b.input_ids;
  if (options.ignore_label_id >= 0 || !padding.empty()) {
    b.labels = b.input_ids.clone();
    if (options.ignore_label_id >= 0) b.labels.masked_fill_(b.input_ids == options.ignore_label_id, -100);
    for (const auto& [r, from] : padding) b.labels[r].narrow(0, from, len - from).fill_(-100);
  }
  if (options.segment_ids && len > 1) {
    // Neat packing: a document's first token follows another document, which it cannot see, so
    // it is not a target (the block's first token never is: the model shifts).
    if (b.labels.is_same(b.input_ids)) b.labels = b.input_ids.clone();
    const at::Tensor seg = b.segment_ids;
    const at::Tensor first = seg.narrow(1, 1, len - 1) != seg.narrow(1, 0, len - 1);
    b.labels.narrow(1, 1, len - 1).masked_fill_(first, -100);
  }
  return b;
}

Batch DataLoader::make_batch(int64_t epoch, int64_t position, const std::vector<int64_t>& order) const {
  const int64_t begin = position * options_.batch_size;
  const int64_t rows = std::min(options_.batch_size, samples_per_rank_ - begin);
  std::vector<BatchRow> batch;
  batch.reserve(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) batch.push_back({dataset_.get(), order[begin + r]});
  Batch b = collate(batch, options_);
  b.epoch = epoch;
  b.position = position;
  return b;
}

void DataLoader::start_worker() {
  if (options_.prefetch <= 0) return;
  worker_ = std::make_unique<Worker>();
  Worker* w = worker_.get();
  w->thread = std::thread([this, w, epoch = epoch_, position = position_]() mutable {
    std::vector<int64_t> order = epoch_order(epoch);
    try {
      for (;;) {
        Batch b = make_batch(epoch, position, order);
        if (++position == batches_per_epoch_) {
          position = 0;
          order = epoch_order(++epoch);
        }
        std::unique_lock lock(w->mutex);
        w->cv.wait(lock, [&] { return w->stop || static_cast<int>(w->ready.size()) < options_.prefetch; });
        if (w->stop) return;
        w->ready.push_back(std::move(b));
        w->cv.notify_all();
      }
    } catch (...) {
      std::lock_guard lock(w->mutex);
      w->error = std::current_exception();
      w->cv.notify_all();
    }
  });
}

void DataLoader::stop_worker() {
  if (!worker_) return;
  {
    std::lock_guard lock(worker_->mutex);
    worker_->stop = true;
  }
  worker_->cv.notify_all();
  worker_->thread.join();
  worker_.reset();
}

Batch DataLoader::next() {
  Batch b;
  if (worker_) {
    std::unique_lock lock(worker_->mutex);
    worker_->cv.wait(lock, [&] { return !worker_->ready.empty() || worker_->error; });
    if (worker_->ready.empty()) std::rethrow_exception(worker_->error);
    b = std::move(worker_->ready.front());
    worker_->ready.pop_front();
    worker_->cv.notify_all();
  } else {
    b = make_batch(epoch_, position_, epoch_order(epoch_));
  }
  if (++position_ == batches_per_epoch_) {
    position_ = 0;
    ++epoch_;
  }
  return b;
}

LoaderState DataLoader::state() const {
  return {epoch_,
          position_,
          options_.seed,
          dataset_->num_blocks(),
          options_.batch_size,
          options_.world_size,
          options_.rank,
          options_.shuffle,
          options_.order == LoaderOptions::Order::kTorchRandperm ? "torch_randperm" : "kiln"};
}

void DataLoader::restore(const LoaderState& s) {
  const auto mismatch = [](const char* field, auto saved, auto now) {
    return std::runtime_error(fmt::format(
        "loader state: {} was {} when saved but is {} now; the saved position does not apply to this data/run", field,
        saved, now));
  };
  if (s.num_blocks != dataset_->num_blocks()) throw mismatch("num_blocks", s.num_blocks, dataset_->num_blocks());
  if (s.seed != options_.seed) throw mismatch("seed", s.seed, options_.seed);
  if (s.batch_size != options_.batch_size) throw mismatch("batch_size", s.batch_size, options_.batch_size);
  if (s.world_size != options_.world_size) throw mismatch("world_size", s.world_size, options_.world_size);
  if (s.rank != options_.rank) throw mismatch("rank", s.rank, options_.rank);
  if (s.shuffle != options_.shuffle) throw mismatch("shuffle", s.shuffle, options_.shuffle);
  if (s.order != state().order) throw mismatch("order", s.order, state().order);
  if (s.epoch < 0 || s.position < 0 || s.position >= batches_per_epoch_)
    throw std::runtime_error(fmt::format("loader state: position {} of epoch {} is outside the {} batches per epoch",
                                         s.position, s.epoch, batches_per_epoch_));
  stop_worker();
  epoch_ = s.epoch;
  position_ = s.position;
  start_worker();
}

}  // namespace kiln::data
