// LLaMA-Factory's streamed examples and the DataLoader's batches over them
// (data/stream_dataset.h): what they hold (constant in the data's size), the workers' turns, HF's
// windows at the end of an epoch's stream, and a restored position giving exactly the batches of
// an uninterrupted run. tests/python/test_lf_parity.py compares the batches token for token with
// LLaMA-Factory's own DataLoader, and whole streaming runs with its logged losses.
#include <algorithm>
#include <filesystem>
#include <set>
#include <vector>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "kiln/data/shards.h"
#include "kiln/data/stream_dataset.h"
#include "support.h"

using namespace kiln::data;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// `count` documents of 2 + (i * 7) % `spread` tokens each, every token its document's index
// (mod 60000), the last one the EOS 65000.
std::shared_ptr<const TokenSplit> make_docs(const std::string& name, int64_t count, int spread) {
  const fs::path dir = kiln::test::scratch_dir("stream_dataset_" + name);
  ShardSetMeta meta;
  meta.tokenizer = "test";
  meta.vocab_size = 65001;
  meta.eos_id = 65000;
  ShardWriter w(dir.string(), "train", TokenDtype::kUint16, 1 << 22);
  std::vector<int32_t> doc;
  for (int64_t i = 0; i < count; ++i) {
    doc.assign(static_cast<size_t>(2 + (i * 7) % spread), static_cast<int32_t>(i % 60000));
    doc.back() = 65000;
    w.add_document(doc);
  }
  meta.splits.push_back(w.finish());
  write_shard_meta(dir.string(), meta);
  auto split = TokenShards::open(dir.string())->split("train");
  fs::remove_all(dir);
  return split;
}

StreamSpec spec_of(std::shared_ptr<const TokenSplit> docs, std::vector<int64_t> lengths, int64_t workers,
                   int64_t buffer, int64_t block, int64_t map_batch, int64_t batch) {
  StreamSpec s;
  s.documents = std::move(docs);
  s.order.lengths = std::move(lengths);
  s.order.num_shards = workers;
  s.order.seed = 7;
  s.order.buffer_size = buffer;
  s.pack = {.block_len = block, .packing = true, .batch_documents = map_batch, .workers = 1};
  s.batches.batch_size = batch;
  s.batches.pin_memory = false;
  s.batches.ignore_label_id = s.batches.pad_id = 65000;
  return s;
}

bool same(const Batch& a, const Batch& b) {
  return a.input_ids.sizes() == b.input_ids.sizes() && at::equal(a.input_ids, b.input_ids) &&
         at::equal(a.labels, b.labels);
}

}  // namespace

TEST_CASE("StreamLoader holds O(workers x (buffer_size + map batch)) documents, however long the stream",
          "[data][stream]") {
  // 60,000 documents, 2 workers, a buffer of 64 and map batches of 32: at most 2 x (64 + 32)
  // document indices are held at any time, through a whole epoch.
  const int64_t n = 60000;
  const auto docs = make_docs("memory", n, 23);
  StreamLoader loader(spec_of(docs, {40000, n - 40000}, 2, 64, 16, 32, 4));
  int64_t batches = 0, most = 0, rows = 0;
  while (const std::optional<Batch> b = loader.next()) {
    ++batches;
    rows += b->input_ids.size(0);
    most = std::max(most, loader.held_documents());
  }
  CHECK(batches > 1000);
  CHECK(most <= 2 * (64 + 32));
  CHECK(most >= 64);  // the buffers were full
  // Every token of the epoch's blocks came from the documents: the tokens (without EOS) of a
  // block's rows are each a document index, and the epoch read each train document once.
  CHECK(rows * 16 <= docs->num_tokens());
  CHECK(loader.epoch() == 1);  // the epoch ended: the next call starts epoch 1
  CHECK(loader.position() == 0);
}

TEST_CASE("StreamLoader: the workers' batches in turn, a worker left out once exhausted", "[data][stream]") {
  // Unpacked two-token documents: each one example whose first token names it. 9 documents in 2
  // contiguous shards, [0, 5) and [5, 9), a shard per worker (their order shuffled by the seed),
  // a buffer of 1 (the shard's own order): batches of 2 come from the two workers in turn, the
  // one with 5 documents last with its shorter batch, after the other is exhausted.
  const auto docs = make_docs("turns", 9, 1);
  StreamSpec s = spec_of(docs, {9}, 2, 1, 4, 100, 2);
  s.pack.packing = false;
  StreamLoader loader(s);
  std::vector<std::vector<int64_t>> seen;
  while (const std::optional<Batch> b = loader.next()) {
    std::vector<int64_t> firsts;
    for (int64_t r = 0; r < b->input_ids.size(0); ++r) firsts.push_back(b->input_ids[r][0].item<int64_t>());
    seen.push_back(firsts);
  }
  const std::vector<std::vector<int64_t>> a = {{0, 1}, {5, 6}, {2, 3}, {7, 8}, {4}};  // worker 0 reads [0, 5)
  const std::vector<std::vector<int64_t>> b = {{5, 6}, {0, 1}, {7, 8}, {2, 3}, {4}};  // worker 0 reads [5, 9)
  CHECK((seen == a || seen == b));
}

TEST_CASE("next_stream_step: a window cut by the epoch's end joins the next epoch's first window", "[data][stream]") {
  const auto docs = make_docs("windows", 300, 9);
  const StreamSpec s = spec_of(docs, {300}, 1, 16, 8, 50, 3);
  // The epoch's batches, counted once.
  int64_t per_epoch = 0;
  {
    StreamLoader count(s);
    while (count.next()) ++per_epoch;
  }
  const int64_t ga = 4;
  REQUIRE(per_epoch % ga != 0);  // the fixture's point: the epoch ends inside a window
  StreamLoader loader(s);
  int64_t drawn = 0;
  for (int64_t step = 0; drawn < per_epoch; ++step) {
    const StreamStep st = next_stream_step(loader, ga);
    drawn += static_cast<int64_t>(st.batches.size());
    REQUIRE(st.batches.size() == st.window_items.size());
    if (drawn <= per_epoch) {  // an ordinary step: one full window, one normaliser
      CHECK(st.windows == 1);
      CHECK(st.batches.size() == static_cast<size_t>(ga));
      continue;
    }
    // The step across the epochs: the last per_epoch % ga batches of epoch 0 with their own
    // window's items, then epoch 1's first ga batches with theirs.
    const int64_t cut = per_epoch % ga;
    CHECK(st.windows == 2);
    CHECK(static_cast<int64_t>(st.batches.size()) == cut + ga);
    CHECK(st.batches.front().epoch == 0);
    CHECK(st.batches.back().epoch == 1);
    int64_t items = 0;
    for (int64_t i = 0; i < cut; ++i) items += st.batches[i].labels.ne(-100).sum().item<int64_t>();
    CHECK(st.window_items.front() == items);
    CHECK(st.window_items[cut - 1] == items);
    CHECK(st.window_items[cut] != 0);
    // HF's state.epoch: 1 + ga / (max_steps x ga) after it.
    CHECK(stream_epoch_progress(loader, 100, ga) == Approx(1.0 + 4.0 / 400.0));
  }
}

TEST_CASE("StreamLoader: a restored state gives exactly the batches of an uninterrupted run", "[data][stream]") {
  const auto docs = make_docs("resume", 900, 13);
  StreamSpec s = spec_of(docs, {500, 400}, 2, 32, 8, 40, 3);
  s.order.strategy = MixStrategy::kInterleaveUnder;
  s.order.probabilities = {0.4, 0.6};
  s.order.part = StreamPart::kTrain;
  s.order.val_size = 5;
  for (const int64_t k : {0, 1, 17, 60}) {  // 60: past the end of epoch 0, into epoch 1
    StreamLoader run(s);
    for (int64_t i = 0; i < k;) {
      if (run.next()) ++i;  // a nullopt only ends the epoch
    }
    const LoaderState saved = LoaderState::from_json(run.state().to_json());
    StreamLoader resumed(s);
    resumed.restore(saved);
    CHECK(resumed.epoch() == run.epoch());
    CHECK(resumed.position() == run.position());
    for (int i = 0; i < 40; ++i) {
      const std::optional<Batch> a = run.next(), b = resumed.next();
      REQUIRE(a.has_value() == b.has_value());
      if (a) CHECK(same(*a, *b));
    }
  }
  // Another stream's state is refused, naming what differs.
  StreamLoader run(s);
  run.next();
  StreamSpec other = s;
  other.order.buffer_size = 33;
  StreamLoader elsewhere(other);
  CHECK_THAT(kiln::test::error_of([&] { elsewhere.restore(run.state()); }), Contains("stream"));
  LoaderState far = run.state();
  far.position = 1000000;
  CHECK_THAT(kiln::test::error_of([&] { StreamLoader(s).restore(far); }), Contains("past the epoch"));
}

TEST_CASE("StreamLoader refuses LLaMA-Factory's empty streams", "[data][stream]") {
  const auto docs = make_docs("refusals", 20, 3);
  // dataloader_num_workers 0: datasets' to_iterable_dataset(num_shards=0) streams nothing.
  CHECK_THAT(kiln::test::error_of([&] { StreamLoader(spec_of(docs, {20}, 0, 4, 8, 10, 2)); }),
             Contains("dataloader_num_workers 0") && Contains("StopIteration"));
  // Documents that pack into no block of 1000 tokens: the epoch yields no batch (accelerate fails).
  StreamLoader none(spec_of(docs, {20}, 2, 4, 1000, 10, 2));
  CHECK_THAT(kiln::test::error_of([&] { none.next(); }), Contains("yields no batch"));
}
