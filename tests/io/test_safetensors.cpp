// safetensors reader/writer. References: files assembled byte by byte here from the format
// specification (u64 LE header length, JSON header, raw little-endian data), so the reader is
// checked against the spec rather than against kiln's own writer; round trips for every dtype;
// and, for each kind of bad file, the error text (file and tensor named). The Python suite
// (tests/python/test_hf_safetensors.py) cross-checks both directions against PyPI safetensors.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "kiln/io/safetensors.h"
#include "support.h"

namespace fs = std::filesystem;
using kiln::io::SafetensorsCheckpoint;
using kiln::io::SafetensorsError;
using kiln::io::SafetensorsFile;
using kiln::test::error_of;

namespace {

// A file with the given JSON header (padded to `pad_to`) and data bytes, exactly as the spec lays it out.
std::string write_raw(const fs::path& path, const std::string& header, const std::string& data,
                      int64_t header_len = -1) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out << header << data;
  return path.string();
}

std::string bytes_of(const at::Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         bytes_of(a.contiguous()) == bytes_of(b.contiguous());
}

}  // namespace

TEST_CASE("reader decodes a file assembled from the specification", "[io]") {
  const fs::path dir = kiln::test::scratch_dir("st_spec");
  // A 1-byte U8 tensor first puts the F32 data at offset 1: misaligned, so it must be copied.
  const float values[3] = {1.5f, -2.0f, 3.25f};
  std::string data = "\x07";
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  const std::string header = R"({"__metadata__":{"format":"pt"},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("a":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}})";
  const std::string path = write_raw(dir / "x.safetensors", header, data);

  SafetensorsFile file(path);
  CHECK(file.names() == std::vector<std::string>{"b", "a"});  // file order, by offset
  CHECK(file.metadata().at("format") == "pt");
  const at::Tensor a = file.tensor("a");
  CHECK(a.scalar_type() == at::kFloat);
  CHECK(at::equal(a, at::tensor({1.5f, -2.0f, 3.25f})));
  CHECK(file.tensor("b").item<uint8_t>() == 7);
  CHECK_THAT(error_of([&] { file.tensor("c"); }), Catch::Contains(path) && Catch::Contains("'c'"));
}

TEST_CASE("aligned tensors view the mapping without a copy; writes never reach the file", "[io]") {
  const fs::path dir = kiln::test::scratch_dir("st_zerocopy");
  const std::string path = (dir / "w.safetensors").string();
  const at::Tensor w = at::arange(12, at::kFloat).reshape({3, 4});
  kiln::io::save_safetensors(path, {{"w", w}});
  at::Tensor first;
  {
    SafetensorsFile file(path);
    first = file.tensor("w");
    CHECK(first.data_ptr() == file.tensor("w").data_ptr());  // same bytes: no copy was made
  }
  CHECK(at::equal(first, w));  // the tensor keeps the mapping alive after the file object is gone
  first.add_(1);
  CHECK(at::equal(SafetensorsFile(path).tensor("w"), w));  // private mapping: file unchanged
}

TEST_CASE("every supported dtype round trips bit-exactly, with metadata", "[io]") {
  const fs::path dir = kiln::test::scratch_dir("st_dtypes");
  const std::string path = (dir / "all.safetensors").string();
  kiln::io::NamedTensors tensors;
  for (const std::string& name : kiln::io::safetensors_dtype_names()) {
    const at::ScalarType type = kiln::io::scalar_type_from_safetensors(name);
    CHECK(kiln::io::safetensors_dtype_name(type) == name);
    // Random bytes reinterpreted (bool: 0/1), 3x5 so that byte counts are odd for 1-byte types.
    const int64_t nbytes = 15 * static_cast<int64_t>(c10::elementSize(type));
    at::Tensor raw = at::randint(0, type == at::kBool ? 2 : 256, {nbytes}, at::kByte);
    tensors.emplace_back(name, raw.view(type).reshape({3, 5}));
  }
  tensors.emplace_back("scalar", at::scalar_tensor(4.0, at::kDouble));
  tensors.emplace_back("empty", at::empty({0, 3}, at::kBFloat16));
  tensors.emplace_back("strided", at::arange(20, at::kInt).reshape({4, 5}).t());  // non-contiguous input
  kiln::io::save_safetensors(path, tensors, {{"format", "pt"}, {"step", "12"}});

  SafetensorsFile file(path);
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}});
  CHECK(file.names().size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    CAPTURE(name);
    CHECK(same_bits(file.tensor(name), t));
  }
  // No temporary file is left next to the target.
  for (const auto& entry : fs::directory_iterator(dir)) CHECK(entry.path().filename() == "all.safetensors");
}

TEST_CASE("bad files fail with the file and the tensor named", "[io]") {
  const fs::path dir = kiln::test::scratch_dir("st_bad");
  const std::string entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string zeros(8, '\0');
  struct Case {
    const char* name;
    std::string header;
    std::string data;
    int64_t header_len;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {"truncated", "", "", -2, {"too short"}},
      {"header_past_eof", "{" + entry + "}", zeros, 10000, {"header length 10000", "past the end"}},
      {"invalid_json", R"({"w":{"dtype":)", zeros, -1, {"expected valid JSON"}},
      {"not_object", "[1,2]", "", -1, {"expected a JSON object"}},
      {"unknown_dtype", R"({"w":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", zeros, -1, {"'w'", "'F12'"}},
      {"size_mismatch",
       R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       zeros,
       -1,
       {"'w'", "[3]", "12 bytes"}},
      {"out_of_range",
       R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       zeros,
       -1,
       {"'w'", "[8, 16]", "past the end"}},
      {"reversed_offsets",
       R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})",
       zeros,
       -1,
       {"'w'", "end before"}},
      {"overlap",
       "{" + entry + R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, '\0'),
       -1,
       {"'v'", "overlap", "'w'"}},
      {"missing_field", R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", zeros, -1, {"'w'", "'shape'"}},
      {"negative_shape",
       R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
       zeros,
       -1,
       {"'w'", "non-negative"}},
      {"bad_metadata", R"({"__metadata__":{"n":3},)" + entry + "}", zeros, -1, {"__metadata__", "'n'"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const fs::path path = dir / (std::string(c.name) + ".safetensors");
    if (c.header_len == -2) {
      std::ofstream(path, std::ios::binary) << "\x10\x00\x00";
    } else {
      write_raw(path, c.header, c.data, c.header_len);
    }
    std::string message;
    try {
      SafetensorsFile file(path.string());
    } catch (const SafetensorsError& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains(path.string()));
    for (const auto& word : c.words) CHECK_THAT(message, Catch::Contains(word));
  }
  CHECK_THAT(error_of([&] { SafetensorsFile((dir / "nope.safetensors").string()); }),
             Catch::Contains("nope.safetensors") && Catch::Contains("expected a readable file"));
  CHECK_THAT(error_of([&] { kiln::io::save_safetensors((dir / "no" / "dir" / "x.safetensors").string(), {}); }),
             Catch::Contains("x.safetensors"));
  CHECK_THAT(
      error_of([&] {
        kiln::io::save_safetensors((dir / "dup.safetensors").string(), {{"a", at::zeros({1})}, {"a", at::zeros({1})}});
      }),
      Catch::Contains("'a'") && Catch::Contains("twice"));
}

TEST_CASE("sharded checkpoints: index, lazy shards, stale files removed", "[io]") {
  const fs::path dir = kiln::test::scratch_dir("st_sharded");
  kiln::io::NamedTensors tensors;
  for (int i = 0; i < 5; ++i) tensors.emplace_back("t" + std::to_string(i), at::full({100}, i, at::kFloat));
  // 400 bytes each, 1000 bytes per shard: shards of 2, 2, 1 tensors.
  kiln::io::save_safetensors_checkpoint(dir.string(), tensors, {{"format", "pt"}}, 1000);
  CHECK(fs::exists(dir / "model.safetensors.index.json"));
  CHECK(fs::exists(dir / "model-00003-of-00003.safetensors"));
  {
    SafetensorsCheckpoint ckpt(dir.string());
    CHECK(ckpt.files().size() == 3);
    CHECK(ckpt.metadata().at("total_size") == "2000");
    for (const auto& [name, t] : tensors) CHECK(at::equal(ckpt.tensor(name), t));
    CHECK(SafetensorsFile((dir / "model-00002-of-00003.safetensors").string()).names() ==
          std::vector<std::string>{"t2", "t3"});
  }
  // Saving again unsharded leaves exactly one consistent checkpoint.
  kiln::io::save_safetensors_checkpoint(dir.string(), tensors, {}, 1 << 20);
  CHECK(!fs::exists(dir / "model.safetensors.index.json"));
  CHECK(!fs::exists(dir / "model-00001-of-00003.safetensors"));
  CHECK(at::equal(SafetensorsCheckpoint(dir.string()).tensor("t4"), tensors[4].second));

  // An index that points at a shard lacking the tensor, or outside the directory.
  const fs::path bad = kiln::test::scratch_dir("st_bad_index");
  kiln::io::save_safetensors((bad / "a.safetensors").string(), {{"x", at::zeros({2})}});
  std::ofstream(bad / "model.safetensors.index.json") << R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors"}})";
  SafetensorsCheckpoint ckpt(bad.string());
  CHECK(ckpt.names() == std::vector<std::string>{"x", "y"});
  CHECK_THAT(error_of([&] { ckpt.tensor("y"); }), Catch::Contains("a.safetensors") && Catch::Contains("'y'"));
  std::ofstream(bad / "model.safetensors.index.json", std::ios::trunc) << R"({"weight_map":{"x":"../a.safetensors"}})";
  CHECK_THAT(error_of([&] { SafetensorsCheckpoint c(bad.string()); }),
             Catch::Contains("index.json") && Catch::Contains("weight_map['x']"));
  std::ofstream(bad / "model.safetensors.index.json", std::ios::trunc) << R"({"weight_map":)";
  CHECK_THAT(error_of([&] { SafetensorsCheckpoint c(bad.string()); }), Catch::Contains("expected valid JSON"));
  CHECK_THAT(error_of([&] { SafetensorsCheckpoint c(kiln::test::scratch_dir("st_empty").string()); }),
             Catch::Contains("model.safetensors"));
}
