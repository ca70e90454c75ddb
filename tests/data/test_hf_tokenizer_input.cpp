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
  const std::string valid = base_tokenizer().dump(1);
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
