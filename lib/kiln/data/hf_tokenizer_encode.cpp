// HfTokenizer's encoding up to words: the added tokens cut out of the text, the normalizer chain
// on each segment between them, the pre-tokenizer's splits (PCRE2, per-thread match data), each
// word then handed to the BPE model (hf_tokenizer_bpe.cpp). Separate from the reader
// (hf_tokenizer.cpp) because it is the hot path and reads none of the JSON.
#include "kiln/data/hf_tokenizer.h"

#include <stdexcept>

#include <fmt/format.h>
#include <pcre2.h>

#include "kiln/data/hf_tokenizer_internal.h"
#include "kiln/data/unicode_regex.h"
#include "kiln/data/utf8.h"

namespace kiln::data {

using namespace hf;  // the step types of hf_tokenizer_internal.h

ThreadScratch& HfTokenizer::Impl::scratch() const {
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
void HfTokenizer::Impl::split(const PreStep& step, bool exact, std::string_view piece, bool at_start, ThreadScratch& s,
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

// The normalizer chain on one segment (added tokens are split out before it, as in
// tokenizers). lead0: whether the result's first character comes from the original offset 0
// (true on entry iff the segment starts the text); a Replace that deletes the leading
// characters moves it, as tokenizers' alignments do. (Not told apart: a Replace deleting only
// what a Prepend added, which would keep offset 0 in tokenizers; no known tokenizer does that.)
void HfTokenizer::Impl::normalize(std::string_view text, std::string& out, bool& lead0) const {
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

void HfTokenizer::Impl::encode_segment(std::string_view text, bool at_start, ThreadScratch& s,
                                       std::vector<int32_t>& out) const {
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

// Leftmost-longest match of an added token at or after `from`; returns its index or -1.
int32_t HfTokenizer::Impl::find_added(std::string_view text, size_t from, size_t& at) const {
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

}  // namespace kiln::data
