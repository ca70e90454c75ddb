// HfTokenizer's internals shared by its files (not installed): the loaded tables
// (HfTokenizer::Impl) and the step types they hold. hf_tokenizer.cpp reads tokenizer.json into
// them; hf_tokenizer_encode.cpp runs the normalizer, the added tokens and the pre-tokenizer over a
// text; hf_tokenizer_bpe.cpp is the BPE model (a word to ids, with the per-thread word cache);
// hf_tokenizer_decode.cpp turns ids back into text. One file per stage keeps each one readable
// on its own; the tables stay one struct, since every stage reads them.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <pcre2.h>
#include <nlohmann/json_fwd.hpp>

#include "kiln/data/hf_tokenizer.h"
#include "kiln/data/unicode_regex.h"

namespace kiln::data {

// The tables' step types, in a namespace of their own so that their short names stay out of
// kiln::data.
namespace hf {

inline std::atomic<uint64_t> g_next_instance{1};

enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };

// Metaspace's prepend_scheme: when the replacement character goes in front of a piece.
enum class PrependScheme { kAlways, kFirst, kNever };

// Every non-overlapping occurrence of `pattern` (leftmost first) replaced by `content`; an empty
// pattern matches nothing (tokenizers' String pattern).
inline std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content) {
  std::string out;
  if (pattern.empty()) return std::string(text);
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit; (hit = text.find(pattern, pos)) != std::string_view::npos; pos = hit + pattern.size()) {
    out.append(text, pos, hit - pos);
    out.append(content);
  }
  out.append(text, pos);
  return out;
}

// A normalizer step: Prepend(content) when `prepend`, else Replace(String pattern -> content).
struct NormStep {
  bool prepend = false;
  std::string pattern, content;
};

// A decoder step of the SentencePiece family.
struct DecStep {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string pattern, content;  // Replace; Strip's content / Metaspace's replacement in `content`
  uint32_t ch = 0;               // Strip's / Metaspace's character
  int64_t start = 0, stop = 0;   // Strip
  PrependScheme scheme = PrependScheme::kAlways;
};

struct Regex {
  pcre2_code* code = nullptr;
  Regex() = default;
  Regex(const Regex&) = delete;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

struct PreStep {
  std::shared_ptr<Regex> regex;  // null: no split (ByteLevel with use_regex false)
  // The same pattern with Unicode 16.0 classes as explicit ranges (unicode_regex.h), used for a
  // text holding a code point where libpcre2's tables differ; null when the pattern has none.
  std::shared_ptr<Regex> exact;
  Behavior behavior = Behavior::kIsolated;
  bool add_prefix_space = false;
  // Metaspace: ' ' -> replacement, the replacement prepended by `scheme`, then (when `regex` is
  // set) split before each replacement (MergedWithNext).
  bool metaspace = false;
  std::string replacement;
  PrependScheme scheme = PrependScheme::kAlways;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

// Per-thread PCRE2 state and word cache; rebuilt when the thread moves to another tokenizer.
struct ThreadScratch {
  uint64_t owner = 0;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  std::string utf8, normalized;
  std::deque<std::string> arena;
  ~ThreadScratch() { release(); }
  void release() {
    if (match) pcre2_match_data_free(match);
    if (context) pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
    match = nullptr;
    context = nullptr;
    stack = nullptr;
    cache.clear();
  }
};
constexpr size_t kCacheEntries = 1 << 16, kCacheMaxWord = 64;
constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581 "▁", SentencePiece's space

}  // namespace hf

struct HfTokenizer::Impl {
  std::string path;
  uint64_t instance = hf::g_next_instance++;
  uint64_t fingerprint = 0;
  std::vector<std::string> id_bytes;  // raw bytes of every id
  std::vector<char> id_special;
  std::unordered_map<std::string, int32_t> bytes_to_id;    // BPE vocabulary, keyed by raw bytes
  std::unordered_map<std::string, int32_t> content_to_id;  // tokenizer.json strings (vocab + added)
  int32_t byte_id[256];
  int32_t unk_id = -1;
  // false: no ByteLevel pre-tokenizer, so BPE starts from characters as tokenizers' BPE does
  // (SentencePiece-BPE: Llama-2, Mistral, TinyLlama), with byte fallback and unk for the rest.
  bool byte_level = true;
  std::vector<hf::NormStep> normalizers;
  bool byte_fallback = false, fuse_unk = false;
  std::string unk_missing;        // characters mode: an unk_token the vocabulary lacks
  int32_t fallback_id[256];       // "<0xNN>" tokens, -1 where absent
  std::vector<int32_t> char_bmp;  // single-character tokens by code point (< 0x10000), -1 absent
  std::unordered_map<uint32_t, int32_t> char_astral;
  // Characters mode: no token holds "▁" right after another character, "▁" is a token, and no
  // ignore_merges. Then no merge can join a symbol ending in another character to one starting
  // with "▁" (the joined token would hold "X▁"), and unk/byte-fallback symbols are per character
  // with any pending unk flushed at the known "▁", so BPE of a word equals BPE of its parts cut
  // before each "▁" run, ids for ids. Llama-2's vocabulary is of this kind (its "▁▁" tokens are
  // runs); a tokenizer trained across words ("o▁w") is not, and keeps whole words.
  bool split_at_space_mark = false;
  bool has_decoder = false;  // characters mode; without one HF joins the tokens with " "
  std::vector<hf::DecStep> decoders;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
  bool ignore_merges = false;
  std::vector<hf::PreStep> steps;
  std::vector<hf::AddedToken> added;                 // sorted by content length, longest first
  std::vector<std::vector<int32_t>> added_by_first;  // first byte -> indices into added
  std::vector<int32_t> template_prefix, template_suffix;
  int32_t bos = -1, eos = -1;
  std::vector<CodePointRange> unicode_differ;  // union over the steps' patterns

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw std::runtime_error(fmt::format("tokenizer '{}': {}: {}", path, field, what));
  }

  // Reading tokenizer.json (hf_tokenizer.cpp).
  std::shared_ptr<hf::Regex> compile(const std::string& pattern, bool literal, const std::string& field) const;
  hf::PreStep regex_step(const std::string& pattern, bool literal, const std::string& field);
  hf::PrependScheme prepend_scheme(const nlohmann::json& p, const std::string& field) const;

  // Encoding: normalizer, added tokens, pre-tokenizer (hf_tokenizer_encode.cpp).
  hf::ThreadScratch& scratch() const;
  void split(const hf::PreStep& step, bool exact, std::string_view piece, bool at_start, hf::ThreadScratch& s,
             std::vector<std::string_view>& out) const;
  void normalize(std::string_view text, std::string& out, bool& lead0) const;
  void encode_segment(std::string_view text, bool at_start, hf::ThreadScratch& s, std::vector<int32_t>& out) const;
  int32_t find_added(std::string_view text, size_t from, size_t& at) const;

  // The BPE model (hf_tokenizer_bpe.cpp).
  void encode_word(std::string_view p, hf::ThreadScratch& s, std::vector<int32_t>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  template <class Push>
  void initial_symbols(std::string_view word, const Push& push) const;

  // Decoding, characters mode (hf_tokenizer_decode.cpp).
  std::string decode_chain(std::vector<std::string> tokens) const;
};

}  // namespace kiln::data
