// HfTokenizer's BPE model: a word (a pre-tokenizer piece) to ids, through the per-thread word
// cache. The BPE word loop mirrors tokenizers' Word::merge_all (always apply the lowest-rank
// merge, leftmost on ties), which is what makes ids equal. Its own file: the part that decides
// the ids, apart from the reader (hf_tokenizer.cpp) and the splitting (hf_tokenizer_encode.cpp).
#include "kiln/data/hf_tokenizer.h"

#include <algorithm>
#include <queue>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/data/hf_tokenizer_internal.h"
#include "kiln/data/utf8.h"

namespace kiln::data {

using namespace hf;  // the step types of hf_tokenizer_internal.h

void HfTokenizer::Impl::encode_word(std::string_view p, ThreadScratch& s, std::vector<int32_t>& out) const {
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

// Characters mode: the symbols tokenizers' BPE starts a word with. A character in the
// vocabulary is its token; else, with byte fallback, its UTF-8 bytes as <0xNN> tokens when all
// exist; else the unk token (consecutive ones fused into one with fuse_unk), else nothing. As
// in tokenizers, a pending unk is emitted only at the next known character or the word's end.
template <class Push>
void HfTokenizer::Impl::initial_symbols(std::string_view word, const Push& push) const {
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

void HfTokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
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

}  // namespace kiln::data
