// LLaMA-Factory's document split and per-map-batch packing (data/lf_examples.h). References:
// numpy's default_rng(seed).permutation(n) values printed by numpy, torch.randperm values printed
// by PyTorch (torch 2.11, `torch.randperm(n, generator=torch.Generator().manual_seed(s))`), and
// the packing of llamafactory/data/processor/pretrain.py derived by hand below for small streams.
// tests/python/test_lf_parity.py compares whole pipelines with LLaMA-Factory itself.
#include <filesystem>
#include <numeric>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "kiln/data/lf_examples.h"
#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "support.h"

using namespace kiln::data;
namespace fs = std::filesystem;

namespace {

// Documents of the given lengths; token t of the stream is t (so a token names its position).
std::shared_ptr<const TokenSplit> make_docs(const std::string& name, const std::vector<int>& lengths) {
  const fs::path dir = kiln::test::scratch_dir("lf_examples_" + name);
  ShardSetMeta meta;
  meta.tokenizer = "test";
  meta.vocab_size = 1000;
  meta.eos_id = 999;
  ShardWriter w(dir.string(), "train", TokenDtype::kUint16, 1 << 20);
  int32_t t = 0;
  for (const int len : lengths) {
    std::vector<int32_t> doc(len);
    for (auto& x : doc) x = t++;
    w.add_document(doc);
  }
  meta.splits.push_back(w.finish());
  write_shard_meta(dir.string(), meta);
  auto split = TokenShards::open(dir.string())->split("train");
  fs::remove_all(dir);
  return split;
}

std::vector<int64_t> iota_from(int64_t first, int64_t count) {
  std::vector<int64_t> v(count);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int64_t> read(const PackedDataset& ds, int64_t i, std::vector<int32_t>* segments = nullptr) {
  std::vector<int64_t> ids(ds.example_length(i));
  if (segments) segments->assign(ids.size(), -1);
  ds.read_block(i, ids.data(), segments ? segments->data() : nullptr);
  return ids;
}

}  // namespace

TEST_CASE("lf split: numpy's permutation, the test size rounded up, counts as datasets reads them", "[data][lf]") {
  // numpy: default_rng(7).permutation(380)[:10] and [38:48].
  const auto s = split_documents(380, 0.1, false, 7);
  REQUIRE(s.eval.size() == 38);  // ceil(0.1 x 380) = 38
  CHECK(std::vector<int64_t>(s.eval.begin(), s.eval.begin() + 10) ==
        std::vector<int64_t>{155, 297, 232, 34, 61, 225, 0, 257, 203, 361});
  CHECK(std::vector<int64_t>(s.train.begin(), s.train.begin() + 10) ==
        std::vector<int64_t>{293, 126, 163, 121, 193, 239, 157, 190, 9, 57});
  CHECK(s.train.size() == 342);
  // numpy: default_rng(42).permutation(10) = [5 6 0 7 3 2 4 9 1 8]; an integer is a count.
  const auto c = split_documents(10, 3, true, 42);
  CHECK(c.eval == std::vector<int64_t>{5, 6, 0});
  CHECK(c.train == std::vector<int64_t>{7, 3, 2, 4, 9, 1, 8});
  CHECK(split_documents(10, 0.25, false, 1).eval.size() == 3);                  // ceil(2.5)
  CHECK(split_documents(10, 0.21, false, 1).eval.size() == 3);                  // ceil(2.1)
  CHECK(split_documents(10, 1, true, 1).eval.size() == 1);                      // `val_size: 1` is one document
  CHECK(split_documents(10, 2.7, false, 1).eval.size() == 2);                   // int(2.7) above 1
  CHECK_THROWS_AS(split_documents(10, 1.0, false, 1), std::invalid_argument);   // test_size=1.0
  CHECK_THROWS_AS(split_documents(10, 10, true, 1), std::invalid_argument);     // nothing to train on
  CHECK_THROWS_AS(split_documents(10, 0.95, false, 1), std::invalid_argument);  // ceil(9.5) = 10
  // No val_size: the documents keep their order.
  const auto none = split_documents(5, 0, false, 1);
  CHECK(none.train == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(none.eval.empty());
}

TEST_CASE("lf packing: per map batch of documents, each batch's tail dropped", "[data][lf]") {
  // Lengths 5 3 7 | 2 6 4 | 9 at stream offsets 0 5 8 | 15 17 23 | 27 (batches of 3 documents).
  const auto split = make_docs("batches", {5, 3, 7, 2, 6, 4, 9});
  const auto& starts = split->document_starts();
  PackOptions o;
  o.block_len = 4;
  o.batch_documents = 3;
  const auto t = ExampleTable::build(iota_from(0, 7), starts, o);
  // Batch 1: 15 tokens -> 3 blocks from 0 (3 dropped); batch 2: 12 -> 3 blocks from 15; batch 3:
  // 9 -> 2 blocks from 27 (1 dropped).
  REQUIRE(t->num_examples() == 8);
  CHECK(t->fixed_length());
  CHECK(t->dropped_tokens() == 4);
  CHECK(t->total_tokens() == 32);
  const PackedDataset ds(split, t);
  const std::vector<int64_t> first = {0, 4, 8, 15, 19, 23, 27, 31};
  for (int64_t i = 0; i < 8; ++i) CHECK(read(ds, i) == iota_from(first[i], 4));
  // One batch of everything (LLaMA-Factory's default 1000): 36 tokens -> 9 blocks, none dropped.
  o.batch_documents = 1000;
  CHECK(ExampleTable::build(iota_from(0, 7), starts, o)->num_examples() == 9);
}

TEST_CASE("lf packing: documents in the split's order, blocks crossing them", "[data][lf]") {
  const auto split = make_docs("order", {5, 3, 7});
  PackOptions o;
  o.block_len = 4;
  // Order 2 0 1: doc 2 (offsets 8..14), doc 0 (0..4), doc 1 (5..7) = 15 tokens, 3 blocks.
  const PackedDataset ds(split, ExampleTable::build({2, 0, 1}, split->document_starts(), o));
  REQUIRE(ds.num_blocks() == 3);
  std::vector<int32_t> seg;
  CHECK(read(ds, 0, &seg) == std::vector<int64_t>{8, 9, 10, 11});
  CHECK(seg == std::vector<int32_t>{0, 0, 0, 0});
  CHECK(read(ds, 1, &seg) == std::vector<int64_t>{12, 13, 14, 0});
  CHECK(seg == std::vector<int32_t>{0, 0, 0, 1});
  CHECK(read(ds, 2, &seg) == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(ds.dropped_tokens() == 3);  // doc 1, the tail
}

TEST_CASE("lf packing: preprocessing_num_workers cuts contiguous shards first", "[data][lf]") {
  const auto split = make_docs("workers", {5, 3, 7, 2, 6, 4, 9});
  PackOptions o;
  o.block_len = 4;
  o.batch_documents = 3;
  o.workers = 2;
  // datasets' shard(2, i, contiguous=True) of 7: [0, 4) and [4, 7). Shard 0: batch {0,1,2} = 15
  // tokens -> 3 blocks, batch {3} = 2 -> none; shard 1: {4,5,6} = 19 tokens from offset 17 -> 4.
  const auto t = ExampleTable::build(iota_from(0, 7), split->document_starts(), o);
  const PackedDataset ds(split, t);
  REQUIRE(ds.num_blocks() == 7);
  const std::vector<int64_t> first = {0, 4, 8, 17, 21, 25, 29};
  for (int64_t i = 0; i < 7; ++i) CHECK(read(ds, i) == iota_from(first[i], 4));
  // More workers than documents: one document per shard.
  o.workers = 50;
  o.block_len = 2;
  CHECK(ExampleTable::build(iota_from(0, 7), split->document_starts(), o)->num_examples() == 2 + 1 + 3 + 1 + 3 + 2 + 4);
}

TEST_CASE("lf without packing: one example per document, truncated; the loader pads and ignores", "[data][lf]") {
  const auto split = make_docs("unpacked", {5, 3, 7, 2});
  PackOptions o;
  o.block_len = 4;
  o.packing = false;
  const auto t = ExampleTable::build({1, 0, 3, 2}, split->document_starts(), o);
  REQUIRE(t->num_examples() == 4);
  CHECK_FALSE(t->fixed_length());
  CHECK(t->max_length() == 4);
  CHECK(t->dropped_tokens() == 1 + 3);  // the tails of docs 0 and 2
  auto ds = std::make_shared<PackedDataset>(split, t);
  CHECK(read(*ds, 0) == std::vector<int64_t>{5, 6, 7});
  CHECK(read(*ds, 1) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(read(*ds, 2) == std::vector<int64_t>{15, 16});

  LoaderOptions lo;
  lo.batch_size = 3;
  lo.shuffle = false;
  lo.prefetch = 0;
  lo.pad_id = 999;
  lo.ignore_label_id = 1;  // as if token 1 were the pad/EOS
  DataLoader loader(ds, lo);
  const Batch b = loader.next();
  REQUIRE(b.input_ids.sizes() == at::IntArrayRef({3, 4}));  // the batch's longest row
  const auto ids = b.input_ids.contiguous();
  const auto labels = b.labels.contiguous();
  CHECK(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 12) ==
        std::vector<int64_t>{5, 6, 7, 999, 0, 1, 2, 3, 15, 16, 999, 999});
  CHECK(std::vector<int64_t>(labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + 12) ==
        std::vector<int64_t>{5, 6, 7, -100, 0, -100, 2, 3, 15, 16, -100, -100});
  const Batch last = loader.next();  // the epoch's last, one-row batch: no padding at all
  CHECK(last.input_ids.sizes() == at::IntArrayRef({1, 4}));
  CHECK(last.labels.equal(last.input_ids));
}

TEST_CASE("lf sampler: torch.randperm seeded with seed + epoch, restored by the loader state", "[data][lf]") {
  const auto split = make_docs("sampler", std::vector<int>(10, 3));
  PackOptions o;
  o.block_len = 3;
  o.batch_documents = 1;
  auto ds = std::make_shared<PackedDataset>(split, ExampleTable::build(iota_from(0, 10), split->document_starts(), o));
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.seed = 7;
  lo.prefetch = 0;
  lo.order = LoaderOptions::Order::kTorchRandperm;
  DataLoader loader(ds, lo);
  // PyTorch: torch.randperm(10, generator=torch.Generator().manual_seed(7)) and manual_seed(8).
  CHECK(loader.epoch_order(0) == std::vector<int64_t>{5, 0, 3, 4, 1, 7, 9, 6, 8, 2});
  CHECK(loader.epoch_order(1) == std::vector<int64_t>{3, 5, 0, 1, 2, 6, 4, 7, 8, 9});
  const Batch first = loader.next();
  CHECK(first.blocks == std::vector<int64_t>{5, 0, 3, 4});
  const LoaderState saved = LoaderState::from_json(loader.state().to_json());
  CHECK(saved.order == "torch_randperm");
  const Batch second = loader.next();
  lo.order = LoaderOptions::Order::kKiln;
  DataLoader other(ds, lo);
  CHECK_THROWS_WITH(other.restore(saved), Catch::Contains("order"));
  lo.order = LoaderOptions::Order::kTorchRandperm;
  DataLoader resumed(ds, lo);
  resumed.restore(saved);
  CHECK(resumed.next().blocks == second.blocks);
  // A state saved before the field existed reads as kiln's order.
  CHECK(LoaderState::from_json(R"({"epoch":0,"position":0,"seed":7,"num_blocks":10,"batch_size":4,"world_size":1,)"
                               R"("rank":0,"shuffle":true})")
            .order == "kiln");
}

TEST_CASE("lf packing: no examples is LLaMA-Factory's error", "[data][lf]") {
  const auto split = make_docs("empty", {3, 2});
  PackOptions o;
  o.block_len = 8;
  const auto t = ExampleTable::build({0, 1}, split->document_starts(), o);
  CHECK(t->num_examples() == 0);
  CHECK_THROWS_WITH(PackedDataset(split, t), Catch::Contains("Cannot find sufficient samples"));
  CHECK_THROWS_AS(ExampleTable::build({2}, split->document_starts(), o), std::invalid_argument);
}
