// BPE from a Hugging Face tokenizer.json, id for id equal to the HF `tokenizers` library, in two
// families (docs/data.md, "Tokenizers"):
// - byte-level (GPT-2, Llama-3 style): model BPE (merges by rank, ignore_merges), no normalizer,
//   pre-tokenizers ByteLevel / Split(Regex|String) / Sequence of them, ByteLevel decoder;
// - SentencePiece-BPE (Llama-2, Mistral, TinyLlama; no ByteLevel pre-tokenizer, so BPE starts
//   from characters): normalizers Prepend / Replace(String) / Sequence, pre-tokenizer null or
//   Metaspace (prepend_scheme always/first/never, split) or Split, BPE with byte_fallback
//   (<0xNN> tokens), unk_token, fuse_unk, ignore_merges; decoders Replace(String) / ByteFallback /
//   Fuse / Strip / Metaspace / Sequence, whose decode equals HF's decode;
// both with post-processors ByteLevel / TemplateProcessing (BOS) / Sequence and added and
// special tokens. Anything else is refused at load time with an error naming the file and the
// field (e.g. "normalizer.type: normalizer 'NFKC' is not supported"), so a tokenizer kiln cannot
// reproduce exactly never encodes silently differently.
//
// The split regexes run on PCRE2 with JIT (UTF + UCP, so \p{L}, \s etc. are Unicode-aware as in
// Oniguruma, which HF uses), with Unicode 16.0 classes as HF's wherever the system PCRE2's tables
// are older (unicode_regex.h). Ids are validated at load (range, duplicates, gaps, added-token
// order), so a malformed file is an error naming the entry, never a crash.
// Input that is not valid UTF-8 is first made valid by replacing each
// maximal ill-formed subpart with U+FFFD (utf8.h): kiln(bytes) == HF(bytes.decode("utf-8",
// "replace")). Encoding is thread-safe: threads share the tables and keep their own PCRE2 match
// data and a bounded word cache.
#pragma once

#include <memory>

#include "kiln/data/tokenizer.h"

namespace kiln::data {

class HfTokenizer final : public Tokenizer {
 public:
  // eos_token: content of the EOS token; empty = from tokenizer_config.json beside the file, else
  // the first present of <|endoftext|>, <|end_of_text|>, </s>, <|im_end|>, <eos>.
  explicit HfTokenizer(const std::string& tokenizer_json_path, const std::string& eos_token = "");
  ~HfTokenizer() override;
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  void encode_into(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens = false) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  uint64_t fingerprint() const override;
  std::string name() const override;
  int32_t token_to_id(std::string_view content) const;  // -1 when absent
  // Whether tokenizer.json's added_tokens hold `content` (matched before pre-tokenization).
  bool is_added_token(std::string_view content) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::data
