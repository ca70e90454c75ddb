// Packing and the loader. References: LLaMA-Factory's pretraining packing written out directly
// (concatenate, cut into cutoff_len blocks, drop the tail), HF Trainer's batch arithmetic
// (ceil(examples / (batch * world))), torch DistributedSampler's rank split (padded by
// wrapping, rank r takes every world-th), and a loader that never stopped (resume must equal it).
#include <filesystem>
#include <set>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "support.h"

using namespace kiln::data;
namespace fs = std::filesystem;

namespace {

// A shard set of `docs` documents of varied lengths; token t of the stream is t % 251 so that
// any block's expected content is a formula.
std::shared_ptr<const TokenSplit> make_split(const std::string& name, int docs) {
  const fs::path dir = kiln::test::scratch_dir("loader_" + name);
  ShardSetMeta meta;
  meta.tokenizer = "test";
  meta.vocab_size = 259;
  meta.eos_id = 257;
  ShardWriter w(dir.string(), "train", TokenDtype::kUint16, 64);
  int64_t t = 0;
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> doc(3 + (d * 7) % 23);
    for (auto& x : doc) x = static_cast<int32_t>(t++ % 251);
    w.add_document(doc);
  }
  meta.splits.push_back(w.finish());
  write_shard_meta(dir.string(), meta);
  auto split = TokenShards::open(dir.string())->split("train");
  fs::remove_all(dir);  // the maps stay valid after unlinking
  return split;
}

}  // namespace

TEST_CASE("packing: floor(tokens / cutoff_len) blocks of the concatenated stream", "[data]") {
  const auto split = make_split("pack", 30);
  const PackedDataset ds(split, 16);
  CHECK(ds.num_blocks() == split->num_tokens() / 16);
  CHECK(ds.dropped_tokens() == split->num_tokens() % 16);
  // A block range reads the same blocks as the full packing, shifted.
  const PackedDataset tail(split, 16, ds.num_blocks() - 3, 3);
  CHECK(tail.num_blocks() == 3);
  std::vector<int64_t> a(16), b(16);
  tail.read_block(1, a.data());
  ds.read_block(ds.num_blocks() - 2, b.data());
  CHECK(a == b);
  CHECK_THROWS_AS(PackedDataset(split, 16, ds.num_blocks() - 1, 2), std::invalid_argument);
  std::vector<int64_t> ids(16);
  std::vector<int32_t> seg(16);
  for (int64_t b = 0; b < ds.num_blocks(); ++b) {
    ds.read_block(b, ids.data(), seg.data());
    for (int64_t i = 0; i < 16; ++i) {
      CHECK(ids[i] == (b * 16 + i) % 251);
      CHECK(seg[i] == split->document_of(b * 16 + i) - split->document_of(b * 16));
    }
  }
  CHECK_THAT(kiln::test::error_of([&] { PackedDataset(split, 1 << 20); }), Catch::Contains("fewer than one block"));
}

TEST_CASE("loader: HF batch arithmetic, permutations, disjoint ranks", "[data]") {
  const auto ds = std::make_shared<PackedDataset>(make_split("ranks", 60), 8);
  const int64_t n = ds->num_blocks();
  for (const int64_t world : {1, 3}) {
    std::multiset<int64_t> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      DataLoader loader(ds, {.batch_size = 4, .seed = 5, .rank = rank, .world_size = world});
      CHECK(loader.num_examples() == n);
      CHECK(loader.batches_per_epoch() == (n + 4 * world - 1) / (4 * world));
      const auto order = loader.epoch_order(0);
      seen.insert(order.begin(), order.end());
      CHECK(order != loader.epoch_order(1));  // reshuffled per epoch
    }
    std::set<int64_t> distinct(seen.begin(), seen.end());
    CHECK(static_cast<int64_t>(distinct.size()) == n);                            // every block in the epoch
    CHECK(static_cast<int64_t>(seen.size()) == (n + world - 1) / world * world);  // padding by wrapping only
  }
  DataLoader unshuffled(ds, {.batch_size = 4, .shuffle = false});
  const auto b = unshuffled.next();
  CHECK(b.input_ids.sizes() == at::IntArrayRef{4, 8});
  CHECK(b.input_ids.scalar_type() == at::kLong);
  CHECK(b.labels.equal(b.input_ids));
  CHECK(b.input_ids[1][0].item<int64_t>() == 8);  // block 1 starts at token 8
}

TEST_CASE("loader: a restored state yields exactly the batches of an uninterrupted run", "[data]") {
  const auto ds = std::make_shared<PackedDataset>(make_split("resume", 50), 8);
  const LoaderOptions opt{.batch_size = 3, .seed = 11, .segment_ids = true, .prefetch = 3};
  DataLoader full(ds, opt);
  const int64_t steps = full.batches_per_epoch() + 4;  // crosses an epoch boundary
  std::vector<Batch> reference;
  for (int64_t i = 0; i < steps + 3; ++i) reference.push_back(full.next());
  CHECK(reference.back().epoch == 1);
  CHECK(reference[full.batches_per_epoch() - 1].input_ids.size(0) <= 3);  // the last batch may be smaller

  for (const int64_t stop : {int64_t{2}, full.batches_per_epoch() - 1, steps}) {
    std::string saved;
    {
      DataLoader first(ds, opt);
      for (int64_t i = 0; i < stop; ++i) first.next();
      saved = first.state().to_json();
    }
    DataLoader resumed(ds, opt);
    resumed.restore(LoaderState::from_json(saved));
    for (int64_t i = stop; i < stop + 3; ++i) {
      const Batch b = resumed.next();
      CHECK(b.epoch == reference[i].epoch);
      CHECK(b.position == reference[i].position);
      CHECK(b.blocks == reference[i].blocks);
      CHECK(b.input_ids.equal(reference[i].input_ids));
      CHECK(b.segment_ids.equal(reference[i].segment_ids));
    }
  }
  LoaderState other = full.state();
  other.seed = 12;
  CHECK_THAT(kiln::test::error_of([&] { full.restore(other); }), Catch::Contains("seed"));
  CHECK_THAT(kiln::test::error_of([] { LoaderState::from_json("{\"epoch\": 1}"); }), Catch::Contains("position"));
}

TEST_CASE("loader: with segment ids (neat packing) a document's first token in a block is not a target", "[data]") {
  const auto ds = std::make_shared<PackedDataset>(make_split("neat", 40), 16);
  DataLoader loader(ds, {.batch_size = 4, .shuffle = false, .segment_ids = true, .prefetch = 0});
  const Batch b = loader.next();
  const auto seg = b.segment_ids.accessor<int32_t, 2>();
  const auto ids = b.input_ids.accessor<int64_t, 2>();
  const auto labels = b.labels.accessor<int64_t, 2>();
  int64_t starts = 0;
  for (int64_t r = 0; r < b.input_ids.size(0); ++r) {
    CHECK(labels[r][0] == ids[r][0]);  // never a target anyway: the model shifts
    for (int64_t t = 1; t < b.input_ids.size(1); ++t) {
      const bool start = seg[r][t] != seg[r][t - 1];
      starts += start;
      CHECK(labels[r][t] == (start ? -100 : ids[r][t]));
    }
  }
  CHECK(starts > 0);
}
