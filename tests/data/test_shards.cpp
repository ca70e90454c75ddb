// Token shards and kiln::data::tokenize_to_shards. Reference: the documents themselves: what
// was written must read back token for token (round trip), and every disagreement with meta.json
// (checksum, size/dtype, tokenizer fingerprint, missing metadata) must be refused with a message
// naming the shard. Inputs are built in a fresh temp folder per test.
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include <catch2/catch.hpp>

#include "kiln/data/byte_tokenizer.h"
#include "kiln/data/shards.h"
#include "kiln/data/tokenize.h"
#include "support.h"

using namespace kiln::data;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// Writes `docs` (random ids below `vocab`) into `dir` with small shards; returns them.
std::vector<std::vector<int32_t>> write_docs(const fs::path& dir, int64_t vocab, int64_t shard_tokens) {
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> docs;
  ShardSetMeta meta;
  meta.tokenizer = "test";
  meta.tokenizer_fingerprint = 42;
  meta.vocab_size = vocab;
  meta.eos_id = static_cast<int32_t>(vocab - 1);
  meta.dtype = dtype_for_vocab(vocab);
  ShardWriter w(dir.string(), "train", meta.dtype, shard_tokens);
  for (int d = 0; d < 40; ++d) {
    std::vector<int32_t> doc(1 + rng() % 50);
    for (auto& t : doc) t = static_cast<int32_t>(rng() % vocab);
    doc.push_back(meta.eos_id);
    w.add_document(doc);
    docs.push_back(doc);
  }
  meta.splits.push_back(w.finish());
  write_shard_meta(dir.string(), meta);
  return docs;
}

std::vector<int64_t> flatten(const std::vector<std::vector<int32_t>>& docs) {
  std::vector<int64_t> all;
  for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
  return all;
}

}  // namespace

TEST_CASE("shards round-trip tokens and document offsets (uint16 and uint32)", "[data]") {
  for (const int64_t vocab : {259, 70000}) {
    const fs::path dir = kiln::test::scratch_dir("shards_roundtrip" + std::to_string(vocab));
    const auto docs = write_docs(dir, vocab, 100);
    const auto shards = TokenShards::open(dir.string(), {.expected_fingerprint = 42});
    CHECK(shards->meta().dtype == (vocab == 259 ? TokenDtype::kUint16 : TokenDtype::kUint32));
    CHECK(shards->meta().splits[0].shards.size() > 3);  // documents spread over several shards
    const auto split = shards->split("train");
    const auto want = flatten(docs);
    REQUIRE(split->num_tokens() == static_cast<int64_t>(want.size()));
    REQUIRE(split->num_documents() == 40);
    std::vector<int64_t> got(want.size());
    split->copy_tokens(0, split->num_tokens(), got.data());
    CHECK(got == want);
    std::vector<int64_t> mid(37);  // a window crossing shard boundaries
    split->copy_tokens(90, 37, mid.data());
    CHECK(std::equal(mid.begin(), mid.end(), want.begin() + 90));
    int64_t start = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      CHECK(split->document_starts()[d] == start);
      CHECK(split->document_of(start) == static_cast<int64_t>(d));
      start += static_cast<int64_t>(docs[d].size());
    }
    fs::remove_all(dir);
  }
}

TEST_CASE("bad shards are refused with a message naming the file", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("shards_bad");
  write_docs(dir, 259, 100);
  using kiln::test::error_of;
  CHECK_THAT(error_of([&] { TokenShards::open(dir.string(), {.expected_fingerprint = 43}); }),
             Catch::Contains("fingerprint") && Catch::Contains("re-tokenize"));
  const auto put_byte = [&](const char* file, std::streamoff at, char value) {
    std::fstream f(dir / file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    const char old = static_cast<char>(f.get());
    f.seekp(at);
    f.put(value);
    return old;
  };
  const char original = put_byte("train_00001.bin", 2, '\x01');  // flip a low byte: still a valid id
  CHECK_THAT(error_of([&] { TokenShards::open(dir.string()); }),
             Catch::Contains("train_00001.bin") && Catch::Contains("checksum"));
  const char high = put_byte("train_00001.bin", 3, '\x7f');  // a high byte: id >= 32512, past the 259 ids
  CHECK_THAT(error_of([&] { TokenShards::open(dir.string(), {.verify_checksums = false}); }),
             Catch::Contains("train_00001.bin") && Catch::Contains("token id 32") && Catch::Contains("259"));
  put_byte("train_00001.bin", 3, high);
  put_byte("train_00001.bin", 2, original);
  fs::resize_file(dir / "train_00002.bin", fs::file_size(dir / "train_00002.bin") - 1);
  CHECK_THAT(error_of([&] { TokenShards::open(dir.string(), {.verify_checksums = false}); }),
             Catch::Contains("train_00002.bin") && Catch::Contains("dtype"));
  fs::remove(dir / "meta.json");
  CHECK_THAT(error_of([&] { TokenShards::open(dir.string()); }), Catch::Contains("no meta.json"));
  fs::remove_all(dir);
}

TEST_CASE("tokenize_to_shards: txt and jsonl, val split, thread-count independent", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("shards_tokenize");
  fs::create_directories(dir / "in");
  write(dir / "in" / "a.txt", "first document\nstill first");
  write(dir / "in" / "b.jsonl", "{\"text\": \"second\"}\n\n{\"text\": \"third \\u00e9\"}\n{\"text\": \"fourth\"}\n");
  const ByteTokenizer tok;
  TokenizeOptions opt;
  opt.inputs = {(dir / "in").string()};
  opt.val_fraction = 0.5;
  std::vector<std::string> outputs;
  for (const int threads : {1, 3}) {
    opt.threads = threads;
    opt.output_dir = (dir / ("out" + std::to_string(threads))).string();
    const auto report = tokenize_to_shards(tok, opt);
    CHECK(report.documents == 4);
    const auto shards = TokenShards::open(opt.output_dir, {.expected_fingerprint = tok.fingerprint()});
    const auto train = shards->split("train"), val = shards->split("val");
    // every 2nd document (1-based) goes to val: train = docs 0, 2; val = docs 1, 3
    std::vector<int64_t> t(train->num_tokens()), v(val->num_tokens());
    train->copy_tokens(0, t.size(), t.data());
    val->copy_tokens(0, v.size(), v.data());
    std::vector<int64_t> want_t, want_v;
    for (const auto& [doc, into] :
         std::vector<std::pair<std::string, std::vector<int64_t>*>>{{"first document\nstill first", &want_t},
                                                                    {"second", &want_v},
                                                                    {"third \xc3\xa9", &want_t},
                                                                    {"fourth", &want_v}}) {
      for (const unsigned char c : doc) into->push_back(c);
      into->push_back(ByteTokenizer::kEos);
    }
    CHECK(t == want_t);
    CHECK(v == want_v);
    std::ifstream meta(fs::path(opt.output_dir) / "meta.json");
    outputs.emplace_back(std::istreambuf_iterator<char>(meta), std::istreambuf_iterator<char>());
  }
  CHECK(outputs[0] == outputs[1]);  // byte-identical checksums for 1 and 3 threads

  // An existing shard set is not overwritten silently.
  CHECK_THAT(kiln::test::error_of([&] { tokenize_to_shards(tok, opt); }), Catch::Contains("--overwrite"));
  fs::remove_all(dir);
}

TEST_CASE("malformed JSONL lines name file and line; fatal by default, skipped on request", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("shards_badjsonl");
  write(dir / "c.jsonl",
        "{\"text\": \"ok\"}\n{\"text\": oops}\n{\"body\": \"x\"}\n{\"text\": 5}\n{\"text\": \"ok2\"}\n");
  const ByteTokenizer tok;
  TokenizeOptions opt;
  opt.inputs = {(dir / "c.jsonl").string()};
  opt.output_dir = (dir / "out").string();
  CHECK_THAT(kiln::test::error_of([&] { tokenize_to_shards(tok, opt); }),
             Catch::Contains("c.jsonl:2") && Catch::Contains("invalid JSON"));
  CHECK_FALSE(fs::exists(dir / "out"));  // a failed run leaves nothing, not even the folder it made
  std::vector<std::string> warnings;
  opt.skip_bad_lines = true;
  opt.on_warning = [&](const std::string& m) { warnings.push_back(m); };
  const auto report = tokenize_to_shards(tok, opt);
  CHECK(report.documents == 2);
  CHECK(report.bad_lines == 3);
  REQUIRE(warnings.size() == 3);
  CHECK_THAT(warnings[1], Catch::Contains("c.jsonl:3") && Catch::Contains("no key 'text'"));
  CHECK_THAT(warnings[2], Catch::Contains("c.jsonl:4") && Catch::Contains("not a string"));
  CHECK_THAT(kiln::test::error_of([&] { list_input_files({(dir / "nope.txt").string()}); }),
             Catch::Contains("nope.txt"));
  fs::remove_all(dir);
}

TEST_CASE("a failed tokenization leaves nothing behind, also after complete shards", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("shards_fail");
  std::string text;
  for (int i = 0; i < 50; ++i) text += "{\"text\": \"document number " + std::to_string(i) + "\"}\n";
  write(dir / "a.jsonl", text + "{\"text\": oops}\n");
  const ByteTokenizer tok;
  TokenizeOptions opt;
  opt.inputs = {(dir / "a.jsonl").string()};
  opt.shard_tokens = 64;  // several complete shards before the bad line
  opt.output_dir = (dir / "new" / "out").string();
  CHECK_THAT(kiln::test::error_of([&] { tokenize_to_shards(tok, opt); }), Catch::Contains("a.jsonl:51"));
  CHECK_FALSE(fs::exists(dir / "new" / "out"));
  // An existing folder keeps what it held before, and only that.
  fs::create_directories(dir / "mine");
  write(dir / "mine" / "notes.txt", "keep");
  opt.output_dir = (dir / "mine").string();
  CHECK_THROWS(tokenize_to_shards(tok, opt));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "mine")) names.push_back(e.path().filename().string());
  CHECK(names == std::vector<std::string>{"notes.txt"});
}

TEST_CASE("a meta.json shard name that leaves the shard folder is refused", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("shards_escape");
  write_docs(dir, 259, 100);
  const auto meta_text = [&] {
    std::ifstream in(dir / "meta.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  for (const std::string& name : {"../other/train_00000.bin", "/etc/passwd", "sub/train_00000.bin", ".."}) {
    std::string edited = meta_text;
    const auto at = edited.find("\"train_00000.bin\"");
    REQUIRE(at != std::string::npos);
    edited.replace(at, 17, "\"" + name + "\"");
    write(dir / "meta.json", edited);
    CAPTURE(name);
    CHECK_THAT(kiln::test::error_of([&] { TokenShards::open(dir.string()); }),
               Catch::Contains("splits.train.shards[0]") && Catch::Contains(name) &&
                   Catch::Contains("inside the shard folder"));
  }
}
