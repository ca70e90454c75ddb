// HfTokenizer's reader: tokenizer.json (and tokenizer_config.json beside it) into the tables of
// HfTokenizer::Impl (hf_tokenizer_internal.h), refusing what kiln cannot reproduce exactly, with
// the field named; and the accessors. Encoding, the BPE model and decoding are in
// hf_tokenizer_encode.cpp, hf_tokenizer_bpe.cpp and hf_tokenizer_decode.cpp (see hf_tokenizer.h
// for the scope), so that loading, the largest part, reads on its own.
#include "kiln/data/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <pcre2.h>
#include <nlohmann/json.hpp>

#include "kiln/data/hash.h"
#include "kiln/data/hf_tokenizer_internal.h"
#include "kiln/data/unicode_regex.h"
#include "kiln/data/utf8.h"
#include "kiln/io/input_file.h"

namespace kiln::data {

// tokenizer.json: Llama 3's is 9 MB, the largest vocabularies a few tens of MB.
constexpr uint64_t kMaxTokenizerBytes = uint64_t{512} << 20;

using namespace hf;  // the step types of hf_tokenizer_internal.h

namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true (tokenizers byte_level.rs).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 upwards.
std::vector<std::string> byte_to_unicode_table() {
  std::vector<int> cps(256, -1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cps[b] = printable ? b : 256 + n++;
  }
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const int cp = cps[b];
    if (cp < 0x80) {
      out[b] = std::string(1, static_cast<char>(cp));
    } else {
      out[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
  }
  return out;
}

}  // namespace

std::shared_ptr<Regex> HfTokenizer::Impl::compile(const std::string& pattern, bool literal,
                                                  const std::string& field) const {
  auto regex = std::make_shared<Regex>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP (and needs no Unicode classes).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  regex->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
  if (!regex->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail(field, fmt::format("PCRE2 cannot compile pattern at offset {}: {}", offset, reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  return regex;
}

// Compiles a pre-tokenizer regex and, when its classes need it, the Unicode-exact variant.
PreStep HfTokenizer::Impl::regex_step(const std::string& pattern, bool literal, const std::string& field) {
  PreStep step;
  step.regex = compile(pattern, literal, field);
  if (literal) return step;
  UnicodeExactPattern u;
  try {
    u = unicode_exact_pattern(pattern);
  } catch (const std::exception& e) {
    fail(field, e.what());
  }
  if (!u.exact.empty() && !u.differ.empty()) {
    step.exact = compile(u.exact, false, field + " (Unicode " + unicode_tables_version() + " classes)");
    std::vector<CodePointRange> merged = unicode_differ;
    merged.insert(merged.end(), u.differ.begin(), u.differ.end());
    std::sort(merged.begin(), merged.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    unicode_differ.clear();
    for (const auto& r : merged) {
      if (!unicode_differ.empty() && r.first <= unicode_differ.back().last + 1) {
        unicode_differ.back().last = std::max(unicode_differ.back().last, r.last);
      } else {
        unicode_differ.push_back(r);
      }
    }
  }
  return step;
}

// Metaspace's prepend_scheme (default "always"); a legacy add_prefix_space=false must come with
// "never", as tokenizers requires.
PrependScheme HfTokenizer::Impl::prepend_scheme(const json& p, const std::string& field) const {
  PrependScheme scheme = PrependScheme::kAlways;
  if (p.contains("prepend_scheme") && !p["prepend_scheme"].is_null()) {
    const auto v = p["prepend_scheme"].get<std::string>();
    if (v == "first")
      scheme = PrependScheme::kFirst;
    else if (v == "never")
      scheme = PrependScheme::kNever;
    else if (v != "always")
      fail(field + ".prepend_scheme", fmt::format("'{}' is not one of always, first, never", v));
  }
  if (p.contains("add_prefix_space") && !p["add_prefix_space"].is_null() && !p["add_prefix_space"].get<bool>() &&
      scheme != PrependScheme::kNever)
    fail(field + ".add_prefix_space", "false does not match prepend_scheme (tokenizers refuses this too)");
  return scheme;
}

HfTokenizer::HfTokenizer(const std::string& path, const std::string& eos_token) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  // Bounded and regular files only (io/input_file.h): tokenizer.json comes with downloaded models.
  const std::string text = io::read_input_file(path, kMaxTokenizerBytes);
  const json j = io::parse_json(text, path);
  try {
    const auto is_null = [&](const char* key) { return !j.contains(key) || j[key].is_null(); };
    // The mode: byte-level when the pre-tokenizer holds a ByteLevel step, else characters.
    const auto holds_byte_level = [&](const json& p, auto& self) -> bool {
      if (!p.is_object()) return false;
      if (p.value("type", "") == "ByteLevel") return true;
      if (p.value("type", "") == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
        for (const auto& q : p["pretokenizers"])
          if (self(q, self)) return true;
      }
      return false;
    };
    m.byte_level = !is_null("pre_tokenizer") && holds_byte_level(j["pre_tokenizer"], holds_byte_level);
    // A one-character string (Metaspace's replacement, Strip's content).
    const auto one_char = [&](const json& v, const std::string& field) -> std::string {
      const auto str = v.get<std::string>();
      if (str.empty() || valid_utf8_prefix(str) != str.size() ||
          utf8_sequence_length(static_cast<uint8_t>(str[0])) != str.size())
        m.fail(field, fmt::format("'{}' must be one character", str));
      return str;
    };

    // Normalizer: Prepend, Replace (String pattern) and Sequence of them (SentencePiece-BPE).
    const auto add_norm = [&](const json& p, const std::string& field, auto& self) -> void {
      const auto type = p.at("type").get<std::string>();
      if (type == "Sequence") {
        size_t k = 0;
        for (const auto& q : p.at("normalizers")) self(q, fmt::format("{}.normalizers[{}]", field, k++), self);
      } else if (type == "Prepend") {
        m.normalizers.push_back({true, "", p.at("prepend").get<std::string>()});
      } else if (type == "Replace") {
        const json& pattern = p.at("pattern");
        if (!pattern.contains("String")) m.fail(field + ".pattern", "only a String pattern is supported (not a Regex)");
        m.normalizers.push_back({false, pattern["String"].get<std::string>(), p.at("content").get<std::string>()});
      } else {
        m.fail(field + ".type",
               fmt::format("normalizer '{}' is not supported (Prepend, Replace, Sequence of them)", type));
      }
    };
    if (!is_null("normalizer")) {
      add_norm(j["normalizer"], "normalizer", add_norm);
      if (m.byte_level && !m.normalizers.empty())
        m.fail("normalizer", "a normalizer with a ByteLevel pre-tokenizer is not supported");
    }
    const json& model = j.at("model");
    if (model.value("type", "BPE") != "BPE")
      m.fail("model.type", fmt::format("'{}' is not supported (only BPE)", model.value("type", "")));
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
      m.fail("model.dropout", "BPE dropout is not supported");
    m.byte_fallback = model.value("byte_fallback", false);
    if (m.byte_level && m.byte_fallback)
      m.fail("model.byte_fallback", "byte fallback with a ByteLevel pre-tokenizer is not supported");
    m.fuse_unk = model.value("fuse_unk", false);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
        m.fail(std::string("model.") + key, "not supported (byte-level and SentencePiece BPE have none)");
    }
    m.ignore_merges = model.value("ignore_merges", false);

    const std::vector<std::string> b2u = byte_to_unicode_table();
    std::unordered_map<std::string, uint8_t> u2b;
    for (int b = 0; b < 256; ++b) u2b[b2u[b]] = static_cast<uint8_t>(b);
    // Byte-level string (as stored in the file) -> raw bytes; nullopt if a character is outside the map.
    const auto to_bytes = [&](const std::string& s, std::string& outb) {
      outb.clear();
      for (size_t i = 0; i < s.size();) {
        const size_t n = (static_cast<uint8_t>(s[i]) < 0x80) ? 1 : 2;
        const auto it = u2b.find(s.substr(i, n));
        if (it == u2b.end()) return false;
        outb.push_back(static_cast<char>(it->second));
        i += n;
      }
      return true;
    };

    // Ids: the vocabulary's N tokens have ids 0..N-1, each once; added tokens not in it follow as
    // N, N+1, ... in file order (HF tokenizers ignores other ids there and renumbers silently, so
    // a file that says otherwise is refused, naming the entry). Every id is checked before it
    // indexes anything.
    const json& vocab = model.at("vocab");
    if (!vocab.is_object()) m.fail("model.vocab", "must be an object mapping token strings to ids");
    const auto read_id = [&](const json& v, const std::string& field, int64_t limit) -> int32_t {
      if (!v.is_number_integer()) m.fail(field, fmt::format("id {} is not an integer", v.dump().substr(0, 40)));
      if (v.is_number_unsigned() ? v.get<uint64_t>() >= static_cast<uint64_t>(limit)
                                 : (v.get<int64_t>() < 0 || v.get<int64_t>() >= limit)) {
        m.fail(field, fmt::format("id {} is outside 0..{}", v.dump(), limit - 1));
      }
      return static_cast<int32_t>(v.get<int64_t>());
    };
    const auto n_vocab = static_cast<int64_t>(vocab.size());
    std::vector<std::pair<std::string, int32_t>> added_list;  // (content, id) in file order
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) m.fail("added_tokens", "must be a list");
      added_list.reserve(j["added_tokens"].size());
    }
    const int64_t n_total = n_vocab + static_cast<int64_t>(added_list.capacity());
    if (n_total >= (int64_t{1} << 31)) m.fail("model.vocab", fmt::format("{} tokens are too many", n_total));
    m.id_bytes.assign(n_vocab, std::string());
    m.id_special.assign(n_vocab, 0);
    std::vector<const std::string*> owner(n_vocab, nullptr);
    std::string raw;
    for (const auto& [k, v] : vocab.items()) {
      const std::string field = fmt::format("model.vocab['{}']", k.substr(0, 80));
      const int32_t id = read_id(
          v, field + fmt::format(" (the {} tokens' ids must be 0..{}, without gaps)", n_vocab, n_vocab - 1), n_vocab);
      if (owner[id]) m.fail(field, fmt::format("id {} is also the id of '{}'", id, owner[id]->substr(0, 80)));
      owner[id] = &k;
      if (!m.byte_level) {
        raw = k;  // characters mode: tokens are their text
      } else if (!to_bytes(k, raw)) {
        m.fail("model.vocab", fmt::format("token '{}' is not byte-level (not a GPT-2 byte alphabet string)", k));
      }
      m.id_bytes[id] = raw;
      m.bytes_to_id[raw] = id;
      m.content_to_id[k] = id;
    }
    for (int b = 0; b < 256; ++b) {
      const auto it = m.bytes_to_id.find(std::string(1, static_cast<char>(b)));
      m.byte_id[b] = it == m.bytes_to_id.end() ? -1 : it->second;
    }
    if (!m.byte_level) {
      m.char_bmp.assign(0x10000, -1);
      for (const auto& [k, id] : m.bytes_to_id) {
        if (k.empty() || utf8_sequence_length(static_cast<uint8_t>(k[0])) != k.size() ||
            valid_utf8_prefix(k) != k.size())
          continue;
        const uint32_t cp = utf8_code_point(k, 0, k.size());
        if (cp < m.char_bmp.size())
          m.char_bmp[cp] = id;
        else
          m.char_astral[cp] = id;
      }
      for (int b = 0; b < 256; ++b) {
        const auto it = m.bytes_to_id.find(fmt::format("<0x{:02X}>", b));
        m.fallback_id[b] = it == m.bytes_to_id.end() ? -1 : it->second;
      }
    }
    if (!m.byte_level && !m.ignore_merges && m.bytes_to_id.count(std::string(kSpaceMark))) {
      m.split_at_space_mark = true;
      for (const auto& [k, id] : m.bytes_to_id) {
        for (size_t i = k.find(kSpaceMark, 1); i != std::string::npos && m.split_at_space_mark;
             i = k.find(kSpaceMark, i + 1)) {
          if (i < kSpaceMark.size() || k.compare(i - kSpaceMark.size(), kSpaceMark.size(), kSpaceMark) != 0)
            m.split_at_space_mark = false;
        }
        if (!m.split_at_space_mark) break;
      }
    }
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      const auto unk = model["unk_token"].get<std::string>();
      if (m.content_to_id.count(unk)) m.unk_id = m.content_to_id[unk];
      if (!m.byte_level) {
        if (m.unk_id < 0) m.unk_missing = unk;
      } else {
        for (int b = 0; b < 256; ++b) {
          if (m.byte_id[b] < 0)
            m.fail("model.unk_token", "an unk token with an incomplete byte alphabet is not supported");
        }
      }
    }

    const json& merges = model.at("merges");
    int32_t rank = 0;
    std::string left_s, right_s, a, b;
    for (const auto& entry : merges) {
      if (entry.is_string()) {
        const auto s = entry.get<std::string>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos) m.fail("model.merges", fmt::format("entry {} '{}' has no space", rank, s));
        left_s = s.substr(0, sp);
        right_s = s.substr(sp + 1);
      } else {
        left_s = entry.at(0).get<std::string>();
        right_s = entry.at(1).get<std::string>();
      }
      const auto li = m.content_to_id.find(left_s), ri = m.content_to_id.find(right_s),
                 mi = m.content_to_id.find(left_s + right_s);
      if (li == m.content_to_id.end() || ri == m.content_to_id.end() || mi == m.content_to_id.end()) {
        m.fail("model.merges",
               fmt::format("entry {} '{} {}' uses a token missing from the vocabulary", rank, left_s, right_s));
      }
      const uint64_t key =
          (static_cast<uint64_t>(static_cast<uint32_t>(li->second)) << 32) | static_cast<uint32_t>(ri->second);
      m.merges.emplace(key, std::make_pair(rank, mi->second));  // first (lowest rank) wins, as in tokenizers
      ++rank;
    }

    // Pre-tokenizer.
    const auto add_step = [&](const json& p, const std::string& field, auto& self) -> void {
      const auto type = p.at("type").get<std::string>();
      if (type == "Sequence") {
        for (const auto& q : p.at("pretokenizers")) self(q, field + ".pretokenizers", self);
      } else if (type == "Metaspace") {
        if (m.byte_level) m.fail(field + ".type", "Metaspace with a ByteLevel pre-tokenizer is not supported");
        PreStep step;
        const std::string replacement = one_char(p.at("replacement"), field + ".replacement");
        const PrependScheme scheme = m.prepend_scheme(p, field);
        if (p.value("split", true)) {
          step = m.regex_step(replacement, true, field + ".replacement");
          step.behavior = Behavior::kMergedWithNext;
        }
        step.metaspace = true;
        step.replacement = replacement;
        step.scheme = scheme;
        m.steps.push_back(step);
      } else if (type == "ByteLevel") {
        PreStep step;
        if (p.value("use_regex", true)) step = m.regex_step(kGpt2Pattern, false, field);
        step.add_prefix_space = p.value("add_prefix_space", false);
        m.steps.push_back(step);
      } else if (type == "Split") {
        if (p.value("invert", false)) m.fail(field, "Split with invert=true is not supported");
        const json& pattern = p.at("pattern");
        PreStep step = pattern.contains("Regex")
                           ? m.regex_step(pattern["Regex"].get<std::string>(), false, field + ".pattern")
                           : m.regex_step(pattern.at("String").get<std::string>(), true, field + ".pattern");
        const auto behavior = p.at("behavior").get<std::string>();
        if (behavior == "Isolated")
          step.behavior = Behavior::kIsolated;
        else if (behavior == "Removed")
          step.behavior = Behavior::kRemoved;
        else if (behavior == "MergedWithPrevious")
          step.behavior = Behavior::kMergedWithPrevious;
        else if (behavior == "MergedWithNext")
          step.behavior = Behavior::kMergedWithNext;
        else
          m.fail(field + ".behavior", fmt::format("'{}' is not supported", behavior));
        m.steps.push_back(step);
      } else {
        m.fail(field + ".type",
               fmt::format("pre-tokenizer '{}' is not supported (ByteLevel, Metaspace, Split, Sequence)", type));
      }
    };
    if (!is_null("pre_tokenizer")) add_step(j["pre_tokenizer"], "pre_tokenizer", add_step);

    // Added tokens.
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      int64_t next_id = n_vocab;
      size_t index = 0;
      for (const auto& t : j["added_tokens"]) {
        const std::string field = fmt::format("added_tokens[{}]", index++);
        if (!t.is_object() || !t.contains("content") || !t["content"].is_string())
          m.fail(field, "must be an object with a string 'content'");
        const auto content = t["content"].get<std::string>();
        const std::string named = fmt::format("{} '{}'", field, content.substr(0, 80));
        if (content.empty()) m.fail(named, "empty content");
        for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
          if (t.value(flag, false))
            m.fail("added_tokens", fmt::format("token '{}' has {}=true, which is not supported", content, flag));
        }
        if (!m.normalizers.empty() && t.value("normalized", !t.value("special", false)))
          m.fail(named, "normalized=true with a normalizer is not supported (it is matched in the normalized text)");
        if (!t.contains("id")) m.fail(named, "no 'id'");
        const int32_t id = read_id(t["id"], named, int64_t{1} << 31);
        const auto in_vocab = m.content_to_id.find(content);
        if (in_vocab != m.content_to_id.end()) {
          if (in_vocab->second != id) {
            m.fail(named,
                   fmt::format("id {}, but {} gives it id {}", id,
                               in_vocab->second < n_vocab ? "the vocabulary" : "an earlier entry", in_vocab->second));
          }
        } else {
          if (id != next_id) {
            m.fail(named, fmt::format("id {}; tokens not in the vocabulary must follow its ids in order, so HF "
                                      "tokenizers would give it id {}",
                                      id, next_id));
          }
          ++next_id;
          m.id_bytes.emplace_back();
          m.id_special.push_back(0);
        }
        AddedToken a{content, id, t.value("special", false)};
        m.id_bytes[a.id] = a.content;
        m.id_special[a.id] = a.special;
        m.content_to_id[a.content] = a.id;
        m.added.push_back(a);
      }
    }
    std::stable_sort(m.added.begin(), m.added.end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
    m.added_by_first.assign(256, {});
    for (size_t k = 0; k < m.added.size(); ++k)
      m.added_by_first[static_cast<uint8_t>(m.added[k].content[0])].push_back(static_cast<int32_t>(k));

    // Post-processor: only a TemplateProcessing "single" template changes ids.
    const auto add_post = [&](const json& p, const std::string& field, auto& self) -> void {
      const auto type = p.at("type").get<std::string>();
      if (type == "Sequence") {
        for (const auto& q : p.at("processors")) self(q, field + ".processors", self);
      } else if (type == "TemplateProcessing") {
        bool seen_a = false;
        for (const auto& item : p.at("single")) {
          if (item.contains("Sequence")) {
            seen_a = true;
          } else {
            const auto name = item.at("SpecialToken").at("id").get<std::string>();
            for (const auto& id : p.at("special_tokens").at(name).at("ids")) {
              const int32_t v = read_id(id, fmt::format("{}.special_tokens['{}'].ids", field, name),
                                        static_cast<int64_t>(m.id_bytes.size()));
              (seen_a ? m.template_suffix : m.template_prefix).push_back(v);
            }
          }
        }
      } else if (type != "ByteLevel") {
        m.fail(field + ".type",
               fmt::format("post-processor '{}' is not supported (ByteLevel, TemplateProcessing, Sequence)", type));
      }
    };
    if (!is_null("post_processor")) add_post(j["post_processor"], "post_processor", add_post);
    if (m.byte_level) {
      if (!is_null("decoder")) {
        const auto type = j["decoder"].value("type", "");
        if (type != "ByteLevel")
          m.fail("decoder.type", fmt::format("decoder '{}' is not supported with a ByteLevel pre-tokenizer", type));
      }
    } else if (!is_null("decoder")) {
      m.has_decoder = true;
      const auto add_dec = [&](const json& p, const std::string& field, auto& self) -> void {
        const auto type = p.at("type").get<std::string>();
        DecStep d{};
        if (type == "Sequence") {
          size_t k = 0;
          for (const auto& q : p.at("decoders")) self(q, fmt::format("{}.decoders[{}]", field, k++), self);
          return;
        } else if (type == "Replace") {
          const json& pattern = p.at("pattern");
          if (!pattern.contains("String"))
            m.fail(field + ".pattern", "only a String pattern is supported (not a Regex)");
          d.kind = DecStep::kReplace;
          d.pattern = pattern["String"].get<std::string>();
          d.content = p.at("content").get<std::string>();
        } else if (type == "ByteFallback") {
          d.kind = DecStep::kByteFallback;
        } else if (type == "Fuse") {
          d.kind = DecStep::kFuse;
        } else if (type == "Strip") {
          d.kind = DecStep::kStrip;
          d.content = one_char(p.at("content"), field + ".content");
          d.ch = utf8_code_point(d.content, 0, d.content.size());
          d.start = p.at("start").get<int64_t>();
          d.stop = p.at("stop").get<int64_t>();
          if (d.start < 0 || d.stop < 0) m.fail(field, "start and stop must not be negative");
        } else if (type == "Metaspace") {
          d.kind = DecStep::kMetaspace;
          d.content = one_char(p.at("replacement"), field + ".replacement");
          d.ch = utf8_code_point(d.content, 0, d.content.size());
          d.scheme = m.prepend_scheme(p, field);
        } else {
          m.fail(field + ".type",
                 fmt::format("decoder '{}' is not supported (Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence; "
                             "ByteLevel with a ByteLevel pre-tokenizer)",
                             type));
        }
        m.decoders.push_back(d);
      };
      add_dec(j["decoder"], "decoder", add_dec);
    }
  } catch (const json::exception& e) {
    throw std::runtime_error(fmt::format("tokenizer '{}': unexpected structure: {}", path, e.what()));
  }

  // Special ids: tokenizer_config.json beside the file, the template's BOS, or well-known names.
  json config;
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(config_path)) {
    config = io::read_json_file(config_path.string());
  }
  const auto config_token = [&](const char* key) -> std::string {
    if (!config.is_object() || !config.contains(key) || config[key].is_null()) return "";
    return config[key].is_string() ? config[key].get<std::string>() : config[key].value("content", "");
  };
  const auto lookup = [&](const std::string& content) -> int32_t {
    const auto it = m.content_to_id.find(content);
    return it == m.content_to_id.end() ? -1 : it->second;
  };
  std::string eos_name = eos_token.empty() ? config_token("eos_token") : eos_token;
  if (!eos_name.empty()) {
    m.eos = lookup(eos_name);
    if (m.eos < 0)
      throw std::runtime_error(fmt::format("tokenizer '{}': EOS token '{}' is not in the vocabulary", path, eos_name));
  } else {
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>"}) {
      if ((m.eos = lookup(name)) >= 0) break;
    }
    if (m.eos < 0)
      throw std::runtime_error(
          fmt::format("tokenizer '{}': cannot tell the EOS token; pass it explicitly (--eos)", path));
  }
  const std::string bos_name = config_token("bos_token");
  if (!bos_name.empty()) m.bos = lookup(bos_name);
  if (m.bos < 0 && !m.template_prefix.empty()) m.bos = m.template_prefix.front();
  if (m.bos < 0) {
    for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>"}) {
      if ((m.bos = lookup(name)) >= 0) break;
    }
  }
  m.fingerprint = xxh64(text, static_cast<uint64_t>(m.eos));
}

HfTokenizer::~HfTokenizer() = default;

int64_t HfTokenizer::vocab_size() const {
  return static_cast<int64_t>(impl_->id_bytes.size());
}
int32_t HfTokenizer::bos_id() const {
  return impl_->bos;
}
int32_t HfTokenizer::eos_id() const {
  return impl_->eos;
}
uint64_t HfTokenizer::fingerprint() const {
  return impl_->fingerprint;
}
std::string HfTokenizer::name() const {
  return impl_->path;
}
int32_t HfTokenizer::token_to_id(std::string_view content) const {
  const auto it = impl_->content_to_id.find(std::string(content));
  return it == impl_->content_to_id.end() ? -1 : it->second;
}

bool HfTokenizer::is_added_token(std::string_view content) const {
  return std::any_of(impl_->added.begin(), impl_->added.end(),
                     [&](const hf::AddedToken& a) { return a.content == content; });
}

}  // namespace kiln::data