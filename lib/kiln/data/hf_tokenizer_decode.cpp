// HfTokenizer's decoding: ids back to text; in characters mode (SentencePiece-BPE) through the
// tokenizer.json decoder chain (Replace, ByteFallback, Fuse, Strip, Metaspace), whose result
// equals HF's decode. Apart from encoding, which it shares nothing with but the tables.
#include "kiln/data/hf_tokenizer.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/data/hf_tokenizer_internal.h"
#include "kiln/data/utf8.h"

namespace kiln::data {

using namespace hf;  // the step types of hf_tokenizer_internal.h

// Characters mode: tokenizers' decoder chain over the tokens' strings, then concatenated.
std::string HfTokenizer::Impl::decode_chain(std::vector<std::string> tokens) const {
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

}  // namespace kiln::data
