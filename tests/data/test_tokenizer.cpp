// ByteTokenizer, XXH64 and UTF-8 replacement. References: the XXH64 reference test vectors
// (xxhsum of "", "a", "abc"); Python's bytes.decode("utf-8", errors="replace") for the U+FFFD
// substitution (outputs recorded below); the byte tokenizer's definition (id = byte).
#include <string>

#include <catch2/catch.hpp>

#include "kiln/data/byte_tokenizer.h"
#include "kiln/data/hash.h"
#include "kiln/data/utf8.h"
#include "support.h"

using namespace kiln::data;

TEST_CASE("xxh64 equals the reference test vectors", "[data]") {
  CHECK(xxh64("") == 0xef46db3751d8e999ULL);
  CHECK(xxh64("a") == 0xd24ec4f1a98c6e5bULL);
  CHECK(xxh64("abc") == 0x44bc2cf5ad770999ULL);
  CHECK(hex64(0xabcULL) == "0000000000000abc");
}

TEST_CASE("byte tokenizer: ids are bytes, round-trips any input", "[data]") {
  const ByteTokenizer tok;
  const std::string text = std::string("h\xc3\xa9 \xff\x00!", 7);
  const auto ids = tok.encode(text);
  REQUIRE(ids == std::vector<int32_t>{'h', 0xc3, 0xa9, ' ', 0xff, 0, '!'});
  CHECK(tok.decode(ids) == text);
  CHECK(tok.encode("x", true) == std::vector<int32_t>{ByteTokenizer::kBos, 'x'});
  const std::vector<int32_t> with_eos{'a', ByteTokenizer::kEos};
  CHECK(tok.decode(with_eos) == "a<eos>");
  CHECK(tok.decode(with_eos, true) == "a");
  CHECK(tok.vocab_size() == 259);
  const std::vector<int32_t> bad{300};
  CHECK_THAT(kiln::test::error_of([&] { tok.decode(bad); }), Catch::Contains("300"));
}

TEST_CASE("load_tokenizer names a missing tokenizer.json", "[data]") {
  CHECK(load_tokenizer("byte")->name() == "byte");
  CHECK_THAT(kiln::test::error_of([] { load_tokenizer("/no/such/tokenizer.json"); }),
             Catch::Contains("/no/such/tokenizer.json"));
}

TEST_CASE("invalid UTF-8 is replaced like Python's errors='replace'", "[data]") {
  const std::string fffd = "\xef\xbf\xbd";
  // (input, Python's b.decode("utf-8", "replace").encode("utf-8"))
  const std::vector<std::pair<std::string, std::string>> cases{
      {"a\xff"
       "b",
       "a" + fffd + "b"},
      {"\xe2\x82", fffd},                               // truncated 3-byte sequence: one maximal subpart
      {"\xed\xa0\x80x", fffd + fffd + fffd + "x"},      // surrogate: ED A0 is not a valid prefix
      {"\xf0\x9f\x98", fffd},                           // truncated emoji
      {"\xc0\xaf", fffd + fffd},                        // overlong
      {"\xf4\x90\x80\x80", fffd + fffd + fffd + fffd},  // above U+10FFFF
      {"ok\xe2\x82\xac", "ok\xe2\x82\xac"},             // valid: unchanged
  };
  for (const auto& [in, want] : cases) {
    std::string scratch;
    CHECK(std::string(replace_invalid_utf8(in, scratch)) == want);
  }
  CHECK(valid_utf8_prefix("abc\xff") == 3);
}
