// HfTokenizer: see hf_tokenizer.h for scope. The BPE word loop mirrors tokenizers' Word::merge_all
// (always apply the lowest-rank merge, leftmost on ties), which is what makes ids equal.
#include "kiln/data/hf_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <pcre2.h>
#include <nlohmann/json.hpp>

#include "kiln/data/hash.h"
#include "kiln/data/unicode_regex.h"
#include "kiln/data/utf8.h"

namespace kiln::data {

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

std::atomic<uint64_t> g_next_instance{1};

enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };

// Metaspace's prepend_scheme: when the replacement character goes in front of a piece.
enum class PrependScheme { kAlways, kFirst, kNever };

// Every non-overlapping occurrence of `pattern` (leftmost first) replaced by `content`; an empty
// pattern matches nothing (tokenizers' String pattern).
std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content) {
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

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  uint64_t instance = g_next_instance++;
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
  std::vector<NormStep> normalizers;
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
  std::vector<DecStep> decoders;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
  bool ignore_merges = false;
  std::vector<PreStep> steps;
  std::vector<AddedToken> added;                     // sorted by content length, longest first
  std::vector<std::vector<int32_t>> added_by_first;  // first byte -> indices into added
  std::vector<int32_t> template_prefix, template_suffix;
  int32_t bos = -1, eos = -1;
  std::vector<CodePointRange> unicode_differ;  // union over the steps' patterns

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw std::runtime_error(fmt::format("tokenizer '{}': {}: {}", path, field, what));
  }

  std::shared_ptr<Regex> compile(const std::string& pattern, bool literal, const std::string& field) const {
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
      fail(field,
           fmt::format("PCRE2 cannot compile pattern at offset {}: {}", offset, reinterpret_cast<char*>(message)));
    }
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
    return regex;
  }

  // Compiles a pre-tokenizer regex and, when its classes need it, the Unicode-exact variant.
  PreStep regex_step(const std::string& pattern, bool literal, const std::string& field) {
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
  PrependScheme prepend_scheme(const json& p, const std::string& field) const {
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

  // Characters mode: tokenizers' decoder chain over the tokens' strings, then concatenated.
  std::string decode_chain(std::vector<std::string> tokens) const {
    if (!has_decoder) {  // tokenizers without a decoder: the tokens joined by spaces
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    std::vector<std::string> next;
    for (const DecStep& d : decoders) {
      next.clear();
      switch (d.kind) {
        case DecStep::kReplace:
          for (const auto& t : tokens) next.push_back(replace_all(t, d.pattern, d.content));
          break;
        case DecStep::kFuse: {
          std::string all;
          for (const auto& t : tokens) all += t;
          next.push_back(std::move(all));
          break;
        }
        case DecStep::kByteFallback: {
          // Runs of "<0xNN>" tokens become their bytes when those are valid UTF-8, else one U+FFFD
          // per token (the whole run), as tokenizers' ByteFallback. NN is read like Rust's
          // u8::from_str_radix: two hex digits, or a '+' and one.
          std::string run;
          size_t run_tokens = 0;
          const auto flush = [&] {
            if (run_tokens == 0) return;
            if (valid_utf8_prefix(run) == run.size()) {
              next.push_back(run);
            } else {
              for (size_t k = 0; k < run_tokens; ++k) next.emplace_back("\xEF\xBF\xBD");
            }
            run.clear();
            run_tokens = 0;
          };
          const auto hex = [](char c) -> int {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            return -1;
          };
          for (auto& t : tokens) {
            int value = -1;
            if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
              const int hi = hex(t[3]), lo = hex(t[4]);
              if (hi >= 0 && lo >= 0)
                value = hi * 16 + lo;
              else if (t[3] == '+' && lo >= 0)
                value = lo;
            }
            if (value >= 0) {
              run.push_back(static_cast<char>(value));
              ++run_tokens;
            } else {
              flush();
              next.push_back(std::move(t));
            }
          }
          flush();
          break;
        }
        case DecStep::kStrip:
          // Up to `start` leading and `stop` trailing characters equal to the content removed.
          for (const auto& t : tokens) {
            std::vector<size_t> at;  // byte offset of each character, then the end
            for (size_t i = 0; i < t.size(); i += utf8_sequence_length(static_cast<uint8_t>(t[i]))) at.push_back(i);
            const size_t n = at.size();
            at.push_back(t.size());
            const auto is_ch = [&](size_t k) {
              return utf8_code_point(t, at[k], std::min(at[k + 1], t.size()) - at[k]) == d.ch;
            };
            size_t first = 0, last = n;
            while (first < n && static_cast<int64_t>(first) < d.start && is_ch(first)) ++first;
            while (last > first && static_cast<int64_t>(n - last) < d.stop && is_ch(last - 1)) --last;
            next.push_back(t.substr(at[first], at[last] - at[first]));
          }
          break;
        case DecStep::kMetaspace:
          // The replacement becomes ' ', except in the first token, where it is dropped unless
          // the scheme is "never".
          for (size_t i = 0; i < tokens.size(); ++i) {
            const bool drop = i == 0 && d.scheme != PrependScheme::kNever;
            next.push_back(replace_all(tokens[i], d.content, drop ? "" : " "));
          }
          break;
      }
      tokens.swap(next);
    }
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }

  ThreadScratch& scratch() const {
    thread_local ThreadScratch s;
    if (s.owner != instance) {
      s.release();
      s.owner = instance;
      s.match = pcre2_match_data_create(1, nullptr);
      s.context = pcre2_match_context_create(nullptr);
      s.stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(s.context, nullptr, s.stack);
    }
    return s;
  }

  // Splits `piece` by the step's regex into `out` (empty pieces dropped, as tokenizers does).
  // at_start: the piece begins at offset 0 of the original text (Metaspace's "first" scheme).
  void split(const PreStep& step, bool exact, std::string_view piece, bool at_start, ThreadScratch& s,
             std::vector<std::string_view>& out) const {
    if (step.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
      s.arena.emplace_back(" ");
      s.arena.back().append(piece);
      piece = s.arena.back();
    }
    if (step.metaspace && !piece.empty()) {  // tokenizers' NormalizedString::prepend skips empty text
      std::string& t = s.arena.emplace_back();
      t.reserve(piece.size() + 8);
      for (const char c : piece) {
        if (c == ' ')
          t += step.replacement;
        else
          t.push_back(c);
      }
      const bool want = step.scheme == PrependScheme::kAlways || (step.scheme == PrependScheme::kFirst && at_start);
      if (want && t.compare(0, step.replacement.size(), step.replacement) != 0) t.insert(0, step.replacement);
      piece = t;
    }
    if (!step.regex) {
      if (!piece.empty()) out.push_back(piece);
      return;
    }
    const Regex& regex = exact && step.exact ? *step.exact : *step.regex;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
    size_t start = 0, last = 0;
    std::string_view pending;  // MergedWithNext: the match waiting for the gap after it
    bool has_pending = false, last_was_gap = false;
    const auto emit = [&](std::string_view p, bool is_match) {
      switch (step.behavior) {
        case Behavior::kIsolated:
          if (!p.empty()) out.push_back(p);
          break;
        case Behavior::kRemoved:
          if (!is_match && !p.empty()) out.push_back(p);
          break;
        case Behavior::kMergedWithPrevious:
          if (is_match && !out.empty() && out.back().data() + out.back().size() == p.data() && last_was_gap) {
            out.back() = std::string_view(out.back().data(), out.back().size() + p.size());
          } else if (!p.empty()) {
            out.push_back(p);
          }
          break;
        case Behavior::kMergedWithNext:
          if (is_match) {
            if (has_pending) out.push_back(pending);
            pending = p;
            has_pending = true;
          } else if (has_pending) {
            out.push_back(std::string_view(pending.data(), pending.size() + p.size()));
            has_pending = false;
          } else if (!p.empty()) {
            out.push_back(p);
          }
          break;
      }
      last_was_gap = !is_match;
    };
    while (start <= piece.size()) {
      const int rc = pcre2_match(regex.code, subject, piece.size(), start, PCRE2_NO_UTF_CHECK, s.match, s.context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        throw std::runtime_error(
            fmt::format("tokenizer '{}': regex match failed: {}", path, reinterpret_cast<char*>(message)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.match);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: no split here; step over one character
        if (b >= piece.size()) break;
        start = b + 1;
        while (start < piece.size() && (static_cast<uint8_t>(piece[start]) & 0xC0) == 0x80) ++start;
        continue;
      }
      if (b > last) emit(piece.substr(last, b - last), false);
      emit(piece.substr(b, e - b), true);
      last = start = e;
    }
    if (last < piece.size()) emit(piece.substr(last), false);
    if (has_pending) out.push_back(pending);
  }

  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      const auto it = bytes_to_id.find(std::string(word));
      if (it != bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    struct Sym {
      int32_t id, prev, next;
    };
    std::vector<Sym> syms;
    syms.reserve(word.size());
    const auto push = [&](int32_t id) {
      syms.push_back({id, static_cast<int32_t>(syms.size()) - 1, static_cast<int32_t>(syms.size()) + 1});
    };
    if (byte_level) {
      for (const char c : word) {
        const int32_t id = byte_id[static_cast<uint8_t>(c)];
        if (id >= 0) push(id);  // else: not in the vocabulary and no unk token: tokenizers drops it too
      }
    } else {
      initial_symbols(word, push);
    }
    if (syms.empty()) return;
    syms.back().next = -1;
    struct Cand {
      int32_t rank, pos, merged;
      bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand> heap;
    const auto pair_of = [&](int32_t pos) -> const std::pair<int32_t, int32_t>* {
      const int32_t nx = syms[pos].next;
      if (nx < 0) return nullptr;
      const uint64_t key =
          (static_cast<uint64_t>(static_cast<uint32_t>(syms[pos].id)) << 32) | static_cast<uint32_t>(syms[nx].id);
      const auto it = merges.find(key);
      return it == merges.end() ? nullptr : &it->second;
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) {
      if (const auto* m = pair_of(i)) heap.push({m->first, i, m->second});
    }
    while (!heap.empty()) {
      const Cand top = heap.top();
      heap.pop();
      Sym& left = syms[top.pos];
      if (left.id < 0 || left.next < 0) continue;
      const auto* m = pair_of(top.pos);
      if (!m || m->second != top.merged) continue;  // stale: a neighbour was merged meanwhile
      Sym& right = syms[left.next];
      left.id = top.merged;
      left.next = right.next;
      if (right.next >= 0) syms[right.next].prev = top.pos;
      right.id = -1;
      if (left.prev >= 0) {
        if (const auto* p = pair_of(left.prev)) heap.push({p->first, left.prev, p->second});
      }
      if (const auto* n = pair_of(top.pos)) heap.push({n->first, top.pos, n->second});
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  }

  // Characters mode: the symbols tokenizers' BPE starts a word with. A character in the
  // vocabulary is its token; else, with byte fallback, its UTF-8 bytes as <0xNN> tokens when all
  // exist; else the unk token (consecutive ones fused into one with fuse_unk), else nothing. As
  // in tokenizers, a pending unk is emitted only at the next known character or the word's end.
  template <class Push>
  void initial_symbols(std::string_view word, const Push& push) const {
    int32_t pending = -1;
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::min(utf8_sequence_length(static_cast<uint8_t>(word[i])), word.size() - i);
      const uint32_t cp = utf8_code_point(word, i, n);
      int32_t id = -1;
      if (cp < char_bmp.size()) {
        id = char_bmp[cp];
      } else if (!char_astral.empty()) {
        const auto it = char_astral.find(cp);
        if (it != char_astral.end()) id = it->second;
      }
      if (id >= 0) {
        if (pending >= 0) push(pending);
        pending = -1;
        push(id);
      } else {
        bool all = byte_fallback;
        for (size_t k = 0; all && k < n; ++k) all = fallback_id[static_cast<uint8_t>(word[i + k])] >= 0;
        if (all) {
          for (size_t k = 0; k < n; ++k) push(fallback_id[static_cast<uint8_t>(word[i + k])]);
        } else if (unk_id >= 0) {
          if (pending >= 0 && !fuse_unk) push(pending);
          pending = unk_id;
        } else if (!unk_missing.empty()) {
          throw std::runtime_error(fmt::format(
              "tokenizer '{}': model.unk_token '{}' is needed for '{}' but is not in the vocabulary (HF tokenizers "
              "fails here too)",
              path, unk_missing, word.substr(i, n)));
        }
      }
      i += n;
    }
    if (pending >= 0) push(pending);
  }

  // The normalizer chain on one segment (added tokens are split out before it, as in
  // tokenizers). lead0: whether the result's first character comes from the original offset 0
  // (true on entry iff the segment starts the text); a Replace that deletes the leading
  // characters moves it, as tokenizers' alignments do. (Not told apart: a Replace deleting only
  // what a Prepend added, which would keep offset 0 in tokenizers; no known tokenizer does that.)
  void normalize(std::string_view text, std::string& out, bool& lead0) const {
    out.assign(text);
    for (const NormStep& n : normalizers) {
      if (n.prepend) {
        if (!out.empty()) out.insert(0, n.content);
      } else if (!n.pattern.empty()) {
        if (n.content.empty() && out.compare(0, n.pattern.size(), n.pattern) == 0) lead0 = false;
        out = replace_all(out, n.pattern, n.content);
      }
    }
  }

  void encode_segment(std::string_view text, bool at_start, ThreadScratch& s, std::vector<int32_t>& out) const {
    if (!normalizers.empty()) {
      normalize(text, s.normalized, at_start);
      text = s.normalized;
    }
    if (text.empty()) return;
    std::vector<std::string_view> pieces{text}, next;
    const bool exact = contains_code_point_in(text, unicode_differ);
    for (const PreStep& step : steps) {
      next.clear();
      for (const auto p : pieces) split(step, exact, p, at_start && p.data() == text.data(), s, next);
      pieces.swap(next);
    }
    for (const auto p : pieces) {
      if (!split_at_space_mark) {
        encode_word(p, s, out);
        continue;
      }
      // Exact shortcut (see split_at_space_mark): cut before each run of "▁" that follows
      // another character, so that long words (whole documents in Llama-2's layout) become
      // short cacheable ones.
      size_t begin = 0;
      for (size_t i = p.find(kSpaceMark, 1); i != std::string_view::npos; i = p.find(kSpaceMark, i + 1)) {
        if (i >= kSpaceMark.size() && p.compare(i - kSpaceMark.size(), kSpaceMark.size(), kSpaceMark) == 0) continue;
        encode_word(p.substr(begin, i - begin), s, out);
        begin = i;
      }
      encode_word(p.substr(begin), s, out);
    }
    s.arena.clear();
  }

  void encode_word(std::string_view p, ThreadScratch& s, std::vector<int32_t>& out) const {
    if (p.size() > kCacheMaxWord) {
      bpe(p, out);
      return;
    }
    std::string key(p);
    const auto it = s.cache.find(key);
    if (it != s.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    const size_t before = out.size();
    bpe(p, out);
    if (s.cache.size() >= kCacheEntries) s.cache.clear();
    s.cache.emplace(std::move(key), std::vector<int32_t>(out.begin() + before, out.end()));
  }

  // Leftmost-longest match of an added token at or after `from`; returns its index or -1.
  int32_t find_added(std::string_view text, size_t from, size_t& at) const {
    for (size_t i = from; i < text.size(); ++i) {
      for (const int32_t k : added_by_first[static_cast<uint8_t>(text[i])]) {
        const std::string& c = added[k].content;
        if (text.compare(i, c.size(), c) == 0) {
          at = i;
          return k;
        }
      }
    }
    return -1;
  }
};

HfTokenizer::HfTokenizer(const std::string& path, const std::string& eos_token) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("tokenizer '{}': cannot open", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(fmt::format("tokenizer '{}': not valid JSON: {}", path, e.what()));
  }
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
    std::ifstream cin(config_path);
    try {
      config = json::parse(cin);
    } catch (const json::exception& e) {
      throw std::runtime_error(
          fmt::format("tokenizer config '{}': not valid JSON: {}", config_path.string(), e.what()));
    }
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

void HfTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens) const {
  const Impl& m = *impl_;
  ThreadScratch& s = m.scratch();
  const std::string_view valid = replace_invalid_utf8(text, s.utf8);
  if (add_special_tokens) out.insert(out.end(), m.template_prefix.begin(), m.template_prefix.end());
  size_t pos = 0;
  while (pos < valid.size()) {
    size_t at = valid.size();
    const int32_t k = m.added.empty() ? -1 : m.find_added(valid, pos, at);
    if (at > pos) m.encode_segment(valid.substr(pos, at - pos), pos == 0, s, out);
    if (k < 0) break;
    out.push_back(m.added[k].id);
    pos = at + m.added[k].content.size();
  }
  if (add_special_tokens) out.insert(out.end(), m.template_suffix.begin(), m.template_suffix.end());
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string out;
  std::vector<std::string> tokens;
  for (const int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(m.id_bytes.size()))
      throw std::out_of_range(fmt::format("tokenizer '{}': decode: id {} outside the vocabulary", m.path, id));
    if (skip_special_tokens && m.id_special[id]) continue;
    if (m.byte_level)
      out += m.id_bytes[id];
    else
      tokens.push_back(m.id_bytes[id]);
  }
  return m.byte_level ? out : m.decode_chain(std::move(tokens));
}

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

}  // namespace kiln::data
