// HfTokenizer on malformed tokenizer.json files. References: HF tokenizers' own id rules (ids are
// u32; the vocabulary's N tokens are 0..N-1; an added token not in the vocabulary gets the next
// id, whatever the file says), checked with tokenizers 0.23.3 when these cases were written; and
// the contract that a bad file is one exception naming the file, never a crash. A fuzz loop
// mutates a valid file a few hundred times (numbers swapped for hostile ones, values replaced by
// other JSON types, bytes flipped, text cut) and requires exactly that of every mutation.
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/data/byte_tokenizer.h"
#include "kiln/data/hf_tokenizer.h"
#include "kiln/data/shards.h"
#include "kiln/data/tokenize.h"
#include "support.h"

using kiln::data::HfTokenizer;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A small byte-level BPE tokenizer.json: GPT-2's ByteLevel pre-tokenizer, a Llama-3 style Split
// before it, an added EOS and a BOS template.
json base_tokenizer() {
  json vocab = json::object();
  const std::string letters = "abcdefghijklmnopqrstuvwxyz";
  int id = 0;
  for (char c : letters) vocab[std::string(1, c)] = id++;
  vocab["\xc4\xa0"] = id++;  // "Ġ", the byte-level space
  vocab["ab"] = id++;
  vocab
      ["\xc4\xa0"
       "a"] = id++;
  const int n = id;
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", n}, {"content", "<|end_of_text|>"}, {"special", true}},
        {{"id", n + 1}, {"content", "<|begin_of_text|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"(\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens",
         {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {n + 1}}, {"tokens", {"<|begin_of_text|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "\xc4\xa0 a"}}, {"ignore_merges", false}}},
  };
}

// A small SentencePiece-BPE tokenizer.json in Llama-2's layout: <unk> <s> </s>, the 256 byte
// tokens <0x00>..<0xFF> (ids 3..258), then "▁" (259) and a few letters and merges; the normalizer
// Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, byte fallback, fused unk, a BOS template and
// the decoder Replace / ByteFallback / Fuse / Strip. The expected ids and texts of the tests
// below are HF tokenizers 0.23.3's for this very file.
json sp_tokenizer() {
  json vocab = json::object();
  int id = 0;
  for (const char* t : {"<unk>", "<s>", "</s>"}) vocab[t] = id++;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = id++;
  for (const char* t : {"\u2581", "a", "b", "c", "h", "i", "\u2581a", "ab", "\u2581ab", "hi", "\u2581hi"})
    vocab[t] = id++;
  json added = json::array();
  for (int k = 0; k < 3; ++k) {
    added.push_back({{"id", k},
                     {"content", std::vector<std::string>{"<unk>", "<s>", "</s>"}[k]},
                     {"normalized", false},
                     {"special", true}});
  }
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", {"\u2581 a", "a b", "\u2581a b", "h i", "\u2581 hi"}}}},
  };
}

std::string write(const fs::path& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir / name;
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

std::string load_error(const fs::path& dir, const json& j) {
  const std::string path = write(dir, "tokenizer.json", j.dump());
  return kiln::test::error_of([&] { HfTokenizer t(path); });
}

}  // namespace

TEST_CASE("the base tokenizer.json of these tests loads and encodes", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("hf_input_base");
  const HfTokenizer t(write(dir, "tokenizer.json", base_tokenizer().dump()));
  CHECK(t.vocab_size() == 31);
  CHECK(t.bos_id() == 30);
  CHECK(t.eos_id() == 29);
  CHECK(t.encode("ab ab", true) == std::vector<int32_t>{30, 27, 26, 27});  // the Split keeps " " apart
}

TEST_CASE("a SentencePiece-BPE tokenizer.json encodes and decodes as HF tokenizers", "[data]") {
  using V = std::vector<int32_t>;
  const fs::path dir = kiln::test::scratch_dir("hf_input_sp");
  const HfTokenizer t(write(dir, "tokenizer.json", sp_tokenizer().dump()));
  CHECK(t.vocab_size() == 270);
  CHECK(t.bos_id() == 1);
  CHECK(t.eos_id() == 2);
  CHECK(t.encode("ab hi", true) == V{1, 267, 269});
  CHECK(t.encode("\xe4\xb8\xad", true) == V{1, 259, 231, 187, 176});  // 中: "▁", then its bytes
  CHECK(t.encode("hi<s>ab") == V{269, 1, 267});                       // "▁" prepended after a special token too
  CHECK(t.encode("").empty());
  CHECK(t.decode(V{1, 267, 269}) == "<s> ab hi");
  CHECK(t.decode(V{1, 267, 269}, true) == "ab hi");
  CHECK(t.decode(V{231, 187}) == "\xef\xbf\xbd\xef\xbf\xbd");  // an incomplete run: one U+FFFD per byte token
  CHECK(t.decode(V{269}) == "hi");                             // Strip drops the leading space
  // kiln-generate prints the continuation as it reads after the prompt: " hi", not "hi".
  CHECK(kiln::data::decode_continuation(t, V{1, 267}, V{269}) == " hi");

  json j = sp_tokenizer();
  j["model"]["byte_fallback"] = false;
  fs::create_directories(dir / "unk");
  CHECK(HfTokenizer(write(dir / "unk", "tokenizer.json", j.dump())).encode("\xe4\xb8\xad\xe6\x96\x87 c") ==
        V{259, 0, 259, 262});  // 中文 -> one fused <unk>
  j["model"]["fuse_unk"] = false;
  CHECK(HfTokenizer(write(dir / "unk", "tokenizer.json", j.dump())).encode("\xe4\xb8\xad\xe6\x96\x87 c") ==
        V{259, 0, 0, 259, 262});
  // An unk token the vocabulary lacks: HF fails when it is needed, and so does kiln.
  j["model"]["unk_token"] = "<nope>";
  const HfTokenizer missing(write(dir / "unk", "tokenizer.json", j.dump()));
  CHECK(missing.encode("ab") == V{267});
  CHECK_THAT(kiln::test::error_of([&] { missing.encode("\xe4\xb8\xad"); }),
             Catch::Contains("model.unk_token '<nope>'") && Catch::Contains("not in the vocabulary"));

  // A token "b▁" (a merge across a word end): kiln must not cut words before "▁" (its shortcut
  // for vocabularies without such tokens), or "ab ab" would be ▁ab ▁ab.
  j = sp_tokenizer();
  j["model"]["vocab"]["b\u2581"] = 270;
  j["model"]["merges"].insert(j["model"]["merges"].begin(), "b \u2581");
  fs::create_directories(dir / "across");
  CHECK(HfTokenizer(write(dir / "across", "tokenizer.json", j.dump())).encode("ab ab") == V{265, 270, 266});

  // The Metaspace layout (prepend_scheme "first": no "▁" after a special token) and its decoder.
  j = sp_tokenizer();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}};
  fs::create_directories(dir / "metaspace");
  const HfTokenizer meta(write(dir / "metaspace", "tokenizer.json", j.dump()));
  CHECK(meta.encode("ab hi<s>ab") == V{267, 269, 1, 266});
  CHECK(meta.decode(V{267, 269, 1, 266}) == "ab hi<s>ab");

  // A Split before Metaspace("first"): only the piece at offset 0 gets the "▁". No decoder: HF
  // joins the tokens with spaces.
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "\\d"}}}, {"behavior", "Isolated"}, {"invert", false}},
        j["pre_tokenizer"]}}};
  j["decoder"] = nullptr;
  fs::create_directories(dir / "split");
  const HfTokenizer split(write(dir / "split", "tokenizer.json", j.dump()));
  CHECK(split.encode("ab1hi 2ab") == V{267, 52, 268, 259, 53, 266});
  CHECK(split.encode("1ab") == V{259, 52, 266});
  CHECK(split.encode("<s>ab1ab") == V{1, 266, 52, 266});
  CHECK(split.decode(V{267, 269, 1, 231}) == "\u2581ab \u2581hi <s> <0xE4>");
}

TEST_CASE("SentencePiece-BPE parts kiln cannot reproduce are refused, naming the component", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("hf_input_sp_refused");
  const std::string path = (dir / "tokenizer.json").string();
  struct Case {
    std::string what;
    bool byte_level_base;
    std::function<void(json&)> edit;
    std::vector<std::string> expect;
  };
  const json regex = {{"Regex", "\\s"}};
  const std::vector<Case> cases = {
      {"NFKC normalizer",
       false,
       [](json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       {"normalizer.type", "'NFKC'", "not supported"}},
      {"Lowercase inside the Sequence",
       false,
       [](json& j) {
         j["normalizer"]["normalizers"][1] = {{"type", "Lowercase"}};
       },
       {"normalizer.normalizers[1].type", "'Lowercase'", "not supported"}},
      {"Replace with a Regex",
       false,
       [&](json& j) { j["normalizer"]["normalizers"][1]["pattern"] = regex; },
       {"normalizer.normalizers[1].pattern", "Regex"}},
      {"pre-tokenizer Whitespace",
       false,
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       {"pre_tokenizer.type", "'Whitespace'", "not supported"}},
      {"unknown prepend_scheme",
       false,
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "sometimes"}};
       },
       {"pre_tokenizer.prepend_scheme", "'sometimes'"}},
      {"two-character replacement",
       false,
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
       },
       {"pre_tokenizer.replacement", "one character"}},
      {"decoder WordPiece",
       false,
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       {"decoder.type", "'WordPiece'", "not supported"}},
      {"ByteLevel decoder without a ByteLevel pre-tokenizer",
       false,
       [](json& j) {
         j["decoder"]["decoders"][1] = {{"type", "ByteLevel"}};
       },
       {"decoder.decoders[1].type", "'ByteLevel'", "not supported"}},
      {"decoder Replace with a Regex",
       false,
       [&](json& j) { j["decoder"]["decoders"][0]["pattern"] = regex; },
       {"decoder.decoders[0].pattern", "Regex"}},
      {"Strip of two characters",
       false,
       [](json& j) { j["decoder"]["decoders"][3]["content"] = "  "; },
       {"decoder.decoders[3].content", "one character"}},
      {"Metaspace decoder add_prefix_space=false with prepend_scheme first",
       false,
       [](json& j) {
         j["decoder"] = {{"type", "Metaspace"},
                         {"replacement", "\u2581"},
                         {"add_prefix_space", false},
                         {"prepend_scheme", "first"}};
       },
       {"decoder.add_prefix_space"}},
      {"continuing_subword_prefix",
       false,
       [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       {"model.continuing_subword_prefix", "not supported"}},
      {"end_of_word_suffix",
       false,
       [](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; },
       {"model.end_of_word_suffix", "not supported"}},
      {"BPE dropout", false, [](json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout", "not supported"}},
      {"Unigram", false, [](json& j) { j["model"]["type"] = "Unigram"; }, {"model.type", "'Unigram'"}},
      {"a normalized added token with a normalizer",
       false,
       [](json& j) { j["added_tokens"][1]["normalized"] = true; },
       {"added_tokens[1] '<s>'", "normalized=true", "not supported"}},
      {"byte fallback with ByteLevel",
       true,
       [](json& j) { j["model"]["byte_fallback"] = true; },
       {"model.byte_fallback", "ByteLevel"}},
      {"a normalizer with ByteLevel",
       true,
       [](json& j) {
         j["normalizer"] = {{"type", "Prepend"}, {"prepend", "\u2581"}};
       },
       {"normalizer", "ByteLevel", "not supported"}},
      {"Metaspace with ByteLevel",
       true,
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
       },
       {"pre_tokenizer.pretokenizers.type", "Metaspace", "ByteLevel"}},
      {"a SentencePiece decoder with ByteLevel",
       true,
       [](json& j) {
         j["decoder"] = {{"type", "Fuse"}};
       },
       {"decoder.type", "'Fuse'", "ByteLevel pre-tokenizer"}},
  };
  for (const Case& c : cases) {
    json j = c.byte_level_base ? base_tokenizer() : sp_tokenizer();
    c.edit(j);
    const std::string e = load_error(dir, j);
    CAPTURE(c.what, e);
    CHECK_THAT(e, Catch::Contains(path));
    for (const std::string& part : c.expect) CHECK_THAT(e, Catch::Contains(part));
  }
}

TEST_CASE("tokenizer ids are validated: range, duplicates, gaps, added-token order", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("hf_input_ids");
  const std::string path = (dir / "tokenizer.json").string();
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"negative vocab id",
       [](json& j) {
         j["model"]["vocab"]
          ["\xc4\xa0"
           "a"] = -1;
       },
       {"model.vocab['Ġa']", "-1"}},
      {"vocab id 2^64 (a float to JSON)",
       [](json& j) { j["model"]["vocab"]["b"] = 18446744073709551616.0; },
       {"model.vocab['b']", "not an integer"}},
      {"vocab id 10^12",
       [](json& j) { j["model"]["vocab"]["b"] = 1000000000000LL; },
       {"model.vocab['b']", "1000000000000", "outside 0..28"}},
      {"vocab id uint64 max", [](json& j) { j["model"]["vocab"]["b"] = UINT64_MAX; }, {"model.vocab['b']", "outside"}},
      {"duplicate vocab id", [](json& j) { j["model"]["vocab"]["c"] = 1; }, {"also the id of"}},
      {"gap in the vocab ids", [](json& j) { j["model"]["vocab"]["c"] = 40; }, {"model.vocab['c']", "without gaps"}},
      {"string id", [](json& j) { j["model"]["vocab"]["c"] = "2"; }, {"model.vocab['c']", "not an integer"}},
      {"negative added id",
       [](json& j) { j["added_tokens"][0]["id"] = -1; },
       {"added_tokens[0] '<|end_of_text|>'", "-1"}},
      {"added id 2^64",
       [](json& j) { j["added_tokens"][0]["id"] = 18446744073709551616.0; },
       {"added_tokens[0]", "not an integer"}},
      {"added id with a gap",
       [](json& j) { j["added_tokens"][1]["id"] = 40; },
       {"added_tokens[1] '<|begin_of_text|>'", "id 40", "would give it id 30"}},
      {"added id taking a vocab id",
       [](json& j) { j["added_tokens"][0]["id"] = 3; },
       {"added_tokens[0]", "would give it id 29"}},
      {"added token in the vocab with another id",
       [](json& j) {
         j["added_tokens"][0] = {{"id", 5}, {"content", "c"}};
       },
       {"added_tokens[0] 'c'", "the vocabulary gives it id 2"}},
      {"added token without content",
       [](json& j) { j["added_tokens"][0].erase("content"); },
       {"added_tokens[0]", "content"}},
      {"template id past the vocabulary",
       [](json& j) { j["post_processor"]["special_tokens"]["<|begin_of_text|>"]["ids"][0] = 99; },
       {"post_processor.special_tokens['<|begin_of_text|>'].ids", "99"}},
      {"template id negative",
       [](json& j) { j["post_processor"]["special_tokens"]["<|begin_of_text|>"]["ids"][0] = -7; },
       {"post_processor", "-7"}},
      {"vocab not an object",
       [](json& j) {
         j["model"]["vocab"] = json::array({1, 2});
       },
       {"model.vocab"}},
  };
  for (const Case& c : cases) {
    json j = base_tokenizer();
    c.edit(j);
    const std::string e = load_error(dir, j);
    CAPTURE(c.what, e);
    CHECK_THAT(e, Catch::Contains(path));
    for (const std::string& part : c.expect) CHECK_THAT(e, Catch::Contains(part));
  }
}

TEST_CASE("fuzzed tokenizer.json files load or fail with one message naming the file", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("hf_input_fuzz");
  const std::string path = (dir / "tokenizer.json").string();
  const std::string valid = GENERATE(as<std::string>{}, base_tokenizer().dump(1), sp_tokenizer().dump(1));
  const std::vector<std::string> hostile = {"-1",
                                            "18446744073709551616",
                                            "1000000000000",
                                            "4294967295",
                                            "2147483647",
                                            "2147483648",
                                            "1.5",
                                            "null",
                                            "\"x\"",
                                            "[]",
                                            "{}",
                                            "true",
                                            "0",
                                            "-9223372036854775808",
                                            "1e400"};
  const std::regex number(R"(-?[0-9]+)");
  std::mt19937 rng(20261201);
  int loaded = 0, refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string text = valid;
    const int kind = trial % 4;
    if (kind == 0 || kind == 1) {  // one or two numbers replaced by hostile values
      std::vector<std::pair<size_t, size_t>> spots;
      for (auto it = std::sregex_iterator(text.begin(), text.end(), number); it != std::sregex_iterator(); ++it)
        spots.emplace_back(it->position(), it->length());
      for (int k = 0; k <= kind; ++k) {
        const auto [at, len] = spots[rng() % spots.size()];
        text.replace(at, len, hostile[rng() % hostile.size()]);
        spots.clear();
        for (auto it = std::sregex_iterator(text.begin(), text.end(), number); it != std::sregex_iterator(); ++it)
          spots.emplace_back(it->position(), it->length());
      }
    } else if (kind == 2) {  // a JSON value somewhere replaced by another type
      json j = json::parse(text);
      std::vector<json*> nodes;
      std::function<void(json&)> walk = [&](json& n) {
        nodes.push_back(&n);
        if (n.is_structured())
          for (auto& child : n) walk(child);
      };
      walk(j);
      json* victim = nodes[1 + rng() % (nodes.size() - 1)];
      *victim = json::parse(hostile[rng() % hostile.size()], nullptr, false);
      if (victim->is_discarded()) *victim = nullptr;
      text = j.dump();
    } else {  // bytes flipped, or the text cut short
      if (rng() % 2) {
        for (int k = 0; k < 3; ++k) text[rng() % text.size()] = static_cast<char>(rng() % 256);
      } else {
        text.resize(rng() % text.size());
      }
    }
    write(dir, "tokenizer.json", text);
    try {
      HfTokenizer t(path);
      ++loaded;
      // Whatever loaded must encode and decode within its own id range.
      const auto ids = t.encode("abc ab zz 12 <|end_of_text|>\xe1\xb2\x8a", true);
      for (const int32_t id : ids) {
        CHECK(id >= 0);
        CHECK(id < t.vocab_size());
      }
      CHECK_NOTHROW(t.decode(ids));
    } catch (const std::exception& e) {
      ++refused;
      CAPTURE(trial, text.substr(0, 300));
      CHECK_THAT(std::string(e.what()), Catch::Contains(path));
    }
  }
  CHECK(loaded + refused == 400);
  CHECK(refused > 100);  // the mutations do reach the checks
}

TEST_CASE("prompts are encoded by the BOS rule: flag, training record, else HF's template", "[data]") {
  using kiln::data::BosRule;
  using kiln::data::encode_prompt;
  const fs::path dir = kiln::test::scratch_dir("hf_input_prompt");
  const HfTokenizer with_template(write(dir, "tokenizer.json", base_tokenizer().dump()));
  json plain = base_tokenizer();
  plain["post_processor"] = nullptr;
  fs::create_directories(dir / "plain");
  const HfTokenizer without_template(write(dir / "plain", "tokenizer.json", plain.dump()));
  const kiln::data::ByteTokenizer bytes;
  const std::vector<int32_t> ab{27};  // "ab"
  // No record: HF's tokenizer(text) (the template's BOS where there is one); nothing for bytes.
  CHECK(encode_prompt(with_template, "ab", BosRule::kAuto, std::nullopt).ids == std::vector<int32_t>{30, 27});
  CHECK(encode_prompt(without_template, "ab", BosRule::kAuto, std::nullopt).ids == ab);
  CHECK(encode_prompt(bytes, "ab", BosRule::kAuto, std::nullopt).ids == std::vector<int32_t>{'a', 'b'});
  // A model trained on kiln shards: as they were made (no BOS unless add_special_tokens).
  kiln::data::DataRecord record;
  CHECK(encode_prompt(with_template, "ab", BosRule::kAuto, record).ids == ab);
  record.add_special_tokens = true;
  CHECK(encode_prompt(with_template, "ab", BosRule::kAuto, record).ids == std::vector<int32_t>{30, 27});
  // The flags win.
  CHECK(encode_prompt(without_template, "ab", BosRule::kAdd, std::nullopt).ids == std::vector<int32_t>{30, 27});
  CHECK(encode_prompt(bytes, "ab", BosRule::kAdd, std::nullopt).ids ==
        std::vector<int32_t>{kiln::data::ByteTokenizer::kBos, 'a', 'b'});
  CHECK(encode_prompt(with_template, "ab", BosRule::kNone, record).ids == ab);
}

TEST_CASE("kiln-eval's blocks start by the same BOS rule: flag, training record, else HF's template", "[data]") {
  using kiln::data::block_bos;
  using kiln::data::BosRule;
  const fs::path dir = kiln::test::scratch_dir("hf_input_block_bos");
  const HfTokenizer with_template(write(dir, "tokenizer.json", base_tokenizer().dump()));
  json plain = base_tokenizer();
  plain["post_processor"] = nullptr;
  fs::create_directories(dir / "plain");
  const HfTokenizer without_template(write(dir / "plain", "tokenizer.json", plain.dump()));
  const kiln::data::ByteTokenizer bytes;
  kiln::data::ShardSetMeta shards;
  shards.tokenizer = (dir / "tokenizer.json").string();
  shards.bos_id = 30;
  // A model from elsewhere (no record): the template's BOS, as HF's tokenizer(text) starts a sequence.
  CHECK(block_bos(BosRule::kAuto, std::nullopt, &with_template, shards).id == 30);
  CHECK(block_bos(BosRule::kAuto, std::nullopt, &without_template, shards).id == -1);
  CHECK(block_bos(BosRule::kAuto, std::nullopt, &bytes, shards).id == -1);
  CHECK(block_bos(BosRule::kAuto, std::nullopt, nullptr, shards).id == -1);
  // ... but not twice when the shards' documents already start with it.
  shards.add_special_tokens = true;
  CHECK(block_bos(BosRule::kAuto, std::nullopt, &with_template, shards).id == -1);
  shards.add_special_tokens = false;
  // A model trained on kiln shards: the blocks as it saw them.
  const kiln::data::DataRecord record;
  const auto as_trained = block_bos(BosRule::kAuto, record, &with_template, shards);
  CHECK(as_trained.id == -1);
  CHECK_THAT(as_trained.rule, Catch::Contains("kiln_data.json"));
  // The flags win; --add-bos needs a BOS.
  CHECK(block_bos(BosRule::kAdd, record, nullptr, shards).id == 30);
  CHECK(block_bos(BosRule::kNone, std::nullopt, &with_template, shards).id == -1);
  shards.bos_id = -1;
  CHECK_THAT(kiln::test::error_of([&] { block_bos(BosRule::kAdd, std::nullopt, nullptr, shards); }),
             Catch::Contains("--add-bos") && Catch::Contains("no BOS"));
}
