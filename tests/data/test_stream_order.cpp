// LLaMA-Factory's streaming document order (data/stream_order.h) against HF datasets itself:
// tests/python/fixtures/stream_orders.json, written by make_stream_orders.py with datasets 4.0.0
// (test_stream_orders_fixture.py keeps it equal to what datasets writes). Every case there: the
// documents LLaMA-Factory's calls yield, in this process or in one DataLoader worker, a few
// through torch's DataLoader; plus numpy's Generator.integers / shuffle of a list and datasets'
// epoch seeds, which data/numpy_random.h and stream_order.h reproduce.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/data/numpy_random.h"
#include "kiln/data/stream_order.h"

using namespace kiln::data;

namespace {

const nlohmann::json& golden() {
  static const nlohmann::json g = [] {
    std::ifstream in(KILN_PYTHON_FIXTURES "/stream_orders.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return g;
}

StreamOrderOptions options_of(const nlohmann::json& c) {
  StreamOrderOptions o;
  o.lengths = c["lengths"].get<std::vector<int64_t>>();
  o.num_shards = c["num_shards"].get<int64_t>();
  o.strategy = parse_mix_strategy(c["strategy"].get<std::string>());
  if (!c["probs"].is_null()) o.probabilities = c["probs"].get<std::vector<double>>();
  o.seed = c["seed"].get<uint64_t>();
  o.buffer_size = c["buffer_size"].get<int64_t>();
  o.epoch = c["epoch"].get<int64_t>();
  const std::string part = c["part"].get<std::string>();
  o.part = part == "take" ? StreamPart::kEval : part == "skip" ? StreamPart::kTrain : StreamPart::kAll;
  o.val_size = c["val_size"].get<int64_t>();
  o.num_workers = c["num_workers"].get<int64_t>();
  o.worker = c["worker"].get<int64_t>();
  return o;
}

// Up to `limit` documents (a stream may not end).
std::vector<int64_t> drain(StreamOrder& s, size_t limit) {
  std::vector<int64_t> out;
  for (int64_t x; out.size() < limit && (x = s.next()) != -1;) out.push_back(x);
  return out;
}

std::string describe(const nlohmann::json& c) {
  nlohmann::json d = c;
  d.erase("order");
  return d.dump();
}

// torch's DataLoader over N workers: whole batches of `batch` documents from each worker in turn,
// an exhausted worker left out of the turn (its last batch may be short).
std::vector<int64_t> dataloader_order(StreamOrderOptions o, int64_t batch) {
  std::vector<StreamOrder> workers;
  for (int64_t w = 0; w < o.num_workers; ++w) {
    o.worker = w;
    workers.emplace_back(o);
  }
  std::vector<size_t> active(workers.size());
  for (size_t w = 0; w < active.size(); ++w) active[w] = w;
  std::vector<int64_t> out;
  size_t turn = 0;
  while (!active.empty()) {
    std::vector<int64_t> got;
    for (int64_t x; static_cast<int64_t>(got.size()) < batch && (x = workers[active[turn]].next()) != -1;) {
      got.push_back(x);
    }
    if (got.empty()) {
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(turn));
      if (!active.empty()) turn %= active.size();
      continue;
    }
    out.insert(out.end(), got.begin(), got.end());
    turn = (turn + 1) % active.size();
  }
  return out;
}

}  // namespace

TEST_CASE("StreamOrder equals datasets' streamed order in every fixture case", "[stream_order]") {
  const nlohmann::json& g = golden();
  size_t cases = 0, workers = 0, multi = 0, epochs = 0, loaders = 0, documents = 0;
  for (const auto& c : g["cases"]) {
    INFO(describe(c));
    const auto want = c["order"].get<std::vector<int64_t>>();
    const StreamOrderOptions o = options_of(c);
    std::vector<int64_t> got;
    if (c.contains("dataloader_batch")) {
      got = dataloader_order(o, c["dataloader_batch"].get<int64_t>());
      ++loaders;
    } else {
      StreamOrder s(o);
      got = drain(s, want.size() + 16);
      if (got.size() == want.size()) CHECK(s.next() == -1);  // and stays at the end
    }
    CHECK(got == want);
    ++cases;
    documents += want.size();
    workers += o.num_workers > 0;
    multi += o.lengths.size() > 1;
    epochs += o.epoch > 0;
  }
  // The grid the fixture promises: hundreds of cases, every kind of them.
  CHECK(cases >= 350);
  CHECK(workers >= 50);
  CHECK(multi >= 150);
  CHECK(epochs >= 100);
  CHECK(loaders >= 3);
  CHECK(documents >= 20000);
}

// One dataset: datasets' stream is empty (the fixture's num_shards 0 cases), and LLaMA-Factory dies
// on it in align_dataset (StopIteration). Several: datasets already raises StopIteration in
// concatenate_datasets / interleave_datasets (_resolve_features); StreamOrder is empty there too.
TEST_CASE("StreamOrder: num_shards 0 (LLaMA-Factory's default dataloader_num_workers) streams nothing",
          "[stream_order]") {
  for (auto strategy : {MixStrategy::kConcat, MixStrategy::kInterleaveUnder, MixStrategy::kInterleaveOver}) {
    StreamOrderOptions o;
    o.lengths = {5, 12, 9};
    o.num_shards = 0;
    o.strategy = strategy;
    StreamOrder s(o);
    CHECK(s.next() == -1);
    if (strategy != MixStrategy::kConcat) {
      o.probabilities = {0.2, 0.3, 0.5};
      StreamOrder p(o);
      CHECK(p.next() == -1);
    }
  }
}

TEST_CASE("StreamOrder refuses what datasets and LLaMA-Factory refuse, in their words", "[stream_order]") {
  for (const auto& e : golden()["errors"]) {
    StreamOrderOptions o;
    o.lengths = e["lengths"].get<std::vector<int64_t>>();
    o.num_shards = e["num_shards"].get<int64_t>();
    REQUIRE(e["error"].is_string());
    CHECK_THROWS_WITH(StreamOrder(o), e["error"].get<std::string>());
  }
  StreamOrderOptions o;
  o.lengths = {5, 7};
  o.num_shards = 1;
  o.probabilities = {0.5, 0.5};
  CHECK_THROWS_WITH(StreamOrder(o), "`interleave_probs` is only valid for interleaved mixing.");
  o.strategy = MixStrategy::kInterleaveUnder;
  o.probabilities = {1.0};
  CHECK_THROWS_WITH(StreamOrder(o), "The length of dataset and interleave probs should be identical.");
  o.probabilities = {0.5, 0.6};
  CHECK_THROWS_WITH(StreamOrder(o), "Probabilities do not sum to 1");
  o.probabilities.clear();
  o.buffer_size = 0;
  CHECK_THROWS_AS(StreamOrder(o), std::invalid_argument);
  o.buffer_size = 7;
  o.num_workers = 2;
  o.worker = 2;
  CHECK_THROWS_AS(StreamOrder(o), std::invalid_argument);
  o.num_workers = 0;
  o.num_shards = -1;
  CHECK_THROWS_AS(StreamOrder(o), std::invalid_argument);
  o.num_shards = 1;
  o.lengths = {};
  CHECK_THROWS_AS(StreamOrder(o), std::invalid_argument);
}

TEST_CASE("StreamOrder: interleave_over with a zero probability never ends, as in datasets", "[stream_order]") {
  StreamOrderOptions o;
  o.lengths = {4, 3, 5};
  o.num_shards = 1;
  o.strategy = MixStrategy::kInterleaveOver;
  o.probabilities = {0.5, 0.5, 0.0};
  o.buffer_size = 3;
  StreamOrder s(o);
  const std::vector<int64_t> got = drain(s, 1000);
  CHECK(got.size() == 1000);
  for (int64_t x : got) CHECK(x < 7);  // dataset 2 (documents 7..11) is never drawn

  // Where nothing can ever be drawn, datasets spins without yielding: refused here.
  StreamOrderOptions empty;
  empty.lengths = {1, 0, 0, 4};
  empty.num_shards = 0;
  empty.strategy = MixStrategy::kInterleaveOver;
  empty.probabilities = {0.5, 0.5, 0.0, 0.0};
  CHECK_THROWS_AS(StreamOrder(empty), std::invalid_argument);
}

TEST_CASE("StreamOrder: a long stream yields every document once, train and eval apart", "[stream_order]") {
  StreamOrderOptions o;
  o.lengths = {150000, 90000, 60000};
  o.num_shards = 4;
  o.strategy = MixStrategy::kConcat;
  o.buffer_size = 16384;
  o.seed = 2024;
  o.epoch = 3;
  std::vector<int> seen(300000, 0);
  o.part = StreamPart::kEval;
  o.val_size = 1000;
  StreamOrder eval(o);
  o.part = StreamPart::kTrain;
  StreamOrder train(o);
  int64_t n_eval = 0, n_train = 0;
  for (int64_t x; (x = eval.next()) != -1; ++n_eval) ++seen[static_cast<size_t>(x)];
  for (int64_t x; (x = train.next()) != -1; ++n_train) ++seen[static_cast<size_t>(x)];
  CHECK(n_eval == 1000);
  CHECK(n_train == 299000);
  CHECK(std::count(seen.begin(), seen.end(), 1) == 300000);
}

TEST_CASE("numpy Generator.integers and shuffle of a list equal numpy's", "[stream_order][numpy_random]") {
  const nlohmann::json& g = golden();
  REQUIRE(g["integers"].size() >= 8);
  for (const auto& c : g["integers"]) {
    const uint64_t seed = c["seed"].get<uint64_t>();
    const int64_t high = c["high"].get<int64_t>();
    const int64_t size = c["size"].get<int64_t>();
    INFO("seed " << seed << " high " << high << " size " << size);
    NumpyPcg64 rng(seed);
    CHECK(numpy_integers(rng, 0, high, size) == c["draws"][0].get<std::vector<int64_t>>());
    CHECK(numpy_integers(rng, 0, high, size) == c["draws"][1].get<std::vector<int64_t>>());
  }
  REQUIRE(g["shuffles"].size() >= 3);
  for (const auto& c : g["shuffles"]) {
    const uint64_t seed = c["seed"].get<uint64_t>();
    INFO("seed " << seed);
    NumpyPcg64 rng(seed);
    numpy_integers(rng, 0, c["pre_high"].get<int64_t>(), c["pre_size"].get<int64_t>());
    std::vector<int64_t> x(c["n"].get<size_t>());
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int64_t>(i);
    numpy_shuffle(rng, x);
    CHECK(x == c["shuffled"].get<std::vector<int64_t>>());
  }
  NumpyPcg64 rng(1);
  CHECK(numpy_integers(rng, 0, 5, 0).empty());
  CHECK_THROWS_WITH(numpy_integers(rng, 0, 0, 3), "high <= 0");
  CHECK_THROWS_WITH(numpy_integers(rng, 4, 2, 3), "low >= high");
  std::vector<int64_t> none;
  numpy_shuffle(rng, none);
  CHECK(none.empty());
}

TEST_CASE("stream_epoch_seed equals datasets' _effective_generator seeds", "[stream_order]") {
  const nlohmann::json& g = golden();
  REQUIRE(g["epoch_seeds"].size() >= 12);
  for (const auto& c : g["epoch_seeds"]) {
    const uint64_t seed = c["seed"].get<uint64_t>();
    const int64_t epoch = c["epoch"].get<int64_t>();
    INFO("seed " << seed << " epoch " << epoch);
    CHECK(stream_epoch_seed(seed, epoch) == std::stoull(c["effective_seed"].get<std::string>(), nullptr, 16));
  }
  CHECK(stream_epoch_seed(42, 0) == 42);
  CHECK_THROWS_AS(stream_epoch_seed(42, -1), std::invalid_argument);
}
