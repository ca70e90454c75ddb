// The .parquet and .jsonl.zst readers. References: files written by pyarrow and by the zstandard
// module (tests/data/fixtures/make_reader_fixtures.py) and the texts they were given
// (readers.json): what kiln reads must be those texts, in order, a null as an empty document.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/data/byte_tokenizer.h"
#include "kiln/data/parquet_reader.h"
#include "kiln/data/shards.h"
#include "kiln/data/tokenize.h"
#include "support.h"

using namespace kiln::data;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = KILN_TEST_FIXTURES;

nlohmann::json expected() {
  std::ifstream in(kFixtures / "readers.json");
  return nlohmann::json::parse(in);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The column's texts as written (a null as "").
std::vector<std::string> texts(const nlohmann::json& values) {
  std::vector<std::string> out;
  for (const auto& v : values) out.push_back(v.is_null() ? "" : v.get<std::string>());
  return out;
}

std::vector<std::string> zst_texts() {
  const auto e = expected()["zst"];
  auto out = texts(e["text"]);
  std::string long_doc;
  for (int i = 0; i < e["long"]["times"].get<int>(); ++i) long_doc += e["long"]["repeat"].get<std::string>();
  out[e["long"]["index"].get<size_t>()] = long_doc;
  return out;
}

}  // namespace

TEST_CASE("ParquetTextReader: pyarrow's texts, in order, batch by batch across row groups", "[data][parquet]") {
  const auto file = (kFixtures / "readers.parquet").string();
  if (!parquet_supported()) {
    CHECK_THAT(
        kiln::test::error_of([&] { ParquetTextReader r(file, "text"); }),
        Catch::Contains("readers.parquet") && Catch::Contains("built without Parquet") && Catch::Contains("pyarrow"));
    return;
  }
  const auto e = expected()["parquet"];
  for (const int64_t batch : {int64_t{0}, int64_t{3}, int64_t{7}, int64_t{4096}}) {  // 0: auto (8 MiB)
    for (const char* column : {"text", "wide"}) {                                    // string and large_string
      ParquetTextReader r(file, column, batch);
      CHECK(r.rows() == e["rows"].get<int64_t>());
      CHECK(r.row_groups() == e["row_groups"].get<int64_t>());
      CHECK(r.column_bytes() > 0);
      std::vector<std::string> got;
      int batches = 0;
      while (r.next(got)) ++batches;
      CHECK(batches == (batch == 0 ? 1 : (50 + batch - 1) / batch));
      CHECK(got == texts(e[column]));
      int64_t nulls = 0;
      for (const auto& v : e[column]) nulls += v.is_null();
      CHECK(r.nulls() == nulls);
      CHECK(!r.next(got));  // stays at the end
    }
  }
  CHECK(expected()["parquet"]["text"].size() == 50);
}

TEST_CASE("ParquetTextReader: a missing or non-string column and a non-Parquet file are named", "[data][parquet]") {
  if (!parquet_supported()) return;  // the case above checks the refusal
  const auto file = (kFixtures / "readers.parquet").string();
  CHECK_THAT(kiln::test::error_of([&] { ParquetTextReader r(file, "content"); }),
             Catch::Contains("readers.parquet") && Catch::Contains("no column 'content'") &&
                 Catch::Contains("meta, text, wide, n"));
  CHECK_THAT(kiln::test::error_of([&] { ParquetTextReader r(file, "n"); }),
             Catch::Contains("readers.parquet") && Catch::Contains("column 'n' is int64, not a string column"));
  CHECK_THAT(kiln::test::error_of([&] { ParquetTextReader r(file, "meta"); }),
             Catch::Contains("column 'meta' is struct"));
  const auto json = (kFixtures / "readers.json").string();
  CHECK_THAT(kiln::test::error_of([&] { ParquetTextReader r(json, "text"); }),
             Catch::Contains("readers.json") && Catch::Contains("not a readable Parquet file"));
  CHECK_THAT(kiln::test::error_of([&] { ParquetTextReader r("/nonexistent/x.parquet", "text"); }),
             Catch::Contains("x.parquet") && Catch::Contains("cannot open"));
}

TEST_CASE("tokenize_to_shards reads .parquet: documents, nulls, max documents, errors", "[data][parquet]") {
  if (!parquet_supported()) return;
  const fs::path dir = kiln::test::scratch_dir("readers_parquet");
  const ByteTokenizer tok;
  TokenizeOptions opt;
  opt.inputs = {(kFixtures / "readers.parquet").string()};
  opt.output_dir = (dir / "out").string();
  const auto report = tokenize_to_shards(tok, opt);
  const auto docs = texts(expected()["parquet"]["text"]);
  std::vector<int64_t> want;
  int64_t bytes = 0;
  for (const auto& d : docs) {
    for (const unsigned char c : d) want.push_back(c);
    want.push_back(ByteTokenizer::kEos);
    bytes += static_cast<int64_t>(d.size());
  }
  CHECK(report.documents == 50);
  CHECK(report.nulls == 5);
  CHECK(report.bytes == bytes);
  const auto train = TokenShards::open(opt.output_dir)->split("train");
  std::vector<int64_t> got(train->num_tokens());
  train->copy_tokens(0, train->num_tokens(), got.data());
  CHECK(got == want);

  // max_documents_per_group stops inside a row group (LLaMA-Factory's max_samples: rows, nulls included).
  opt.max_documents_per_group = 10;
  opt.overwrite = true;
  CHECK(tokenize_to_shards(tok, opt).documents == 10);
  // A missing column fails before anything is written, naming the file and the column.
  opt.text_key = "content";
  fs::remove_all(dir / "out");
  CHECK_THAT(kiln::test::error_of([&] { tokenize_to_shards(tok, opt); }),
             Catch::Contains("readers.parquet") && Catch::Contains("'content'"));
  CHECK_FALSE(fs::exists(dir / "out"));
  fs::remove_all(dir);
}

TEST_CASE(".jsonl.zst reads as the JSON Lines zstandard compressed, over frames and buffer ends", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("readers_zst");
  TokenizeOptions opt;
  opt.inputs = {(kFixtures / "readers.jsonl.zst").string()};
  CHECK(read_documents(opt) == zst_texts());
  // .parquet and .jsonl.zst are inputs in a folder (readers.json too; not the .py script)
  CHECK(list_input_files({kFixtures.string()}).size() == 3);

  // Damaged files are errors naming the file: cut short, or not zstd at all.
  const std::string bytes = slurp(kFixtures / "readers.jsonl.zst");
  std::ofstream(dir / "cut.jsonl.zst", std::ios::binary) << bytes.substr(0, bytes.size() - 40);
  opt.inputs = {(dir / "cut.jsonl.zst").string()};
  CHECK_THAT(kiln::test::error_of([&] { read_documents(opt); }),
             Catch::Contains("cut.jsonl.zst") && Catch::Contains("truncated"));
  std::ofstream(dir / "plain.jsonl.zst", std::ios::binary) << "{\"text\": \"not compressed\"}\n";
  opt.inputs = {(dir / "plain.jsonl.zst").string()};
  CHECK_THAT(kiln::test::error_of([&] { read_documents(opt); }),
             Catch::Contains("plain.jsonl.zst") && Catch::Contains("cannot decompress"));
  fs::remove_all(dir);
}

TEST_CASE("a JSON null text is an empty document, as a Parquet null", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("readers_null");
  std::ofstream(dir / "a.jsonl") << "{\"text\": \"x\"}\n{\"text\": null}\n{\"text\": \"y\"}\n";
  TokenizeOptions opt;
  opt.inputs = {(dir / "a.jsonl").string()};
  CHECK(read_documents(opt) == std::vector<std::string>{"x", "", "y"});
  fs::remove_all(dir);
}
