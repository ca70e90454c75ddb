// Corpus -> token shards, the library side of kiln-tokenize (also used to build the embedded
// corpus's shards on first run). Documents are read in order, tokenized in parallel chunks,
// followed by EOS, and written in input order, so the output is byte-identical for any thread
// count. Validation documents are picked by position (every 1/f-th document), not at random, so
// a split needs no seed and streams.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/data/shards.h"
#include "kiln/data/tokenizer.h"

namespace kiln::data {

enum class TxtUnit { kFile, kLine };  // a .txt file is one document, or each non-empty line is

struct TokenizeProgress {
  int64_t bytes_done = 0, bytes_total = 0, documents = 0, tokens = 0;
  double seconds = 0;
};

struct TokenizeOptions {
  // .txt / .jsonl / .jsonl.gz / .jsonl.zst / .json / .parquet files, or folders searched recursively
  std::vector<std::string> inputs;
  std::string output_dir;
  std::string text_key = "text";  // JSON field (Parquet column) holding the document
  // Per entry of `inputs` (empty = text_key for all): its JSON field (LLaMA-Factory's
  // columns.prompt of the dataset the file belongs to).
  std::vector<std::string> input_text_keys;
  // Per entry of `inputs` (empty = each input a group of its own): the dataset it belongs to;
  // max_documents_per_group > 0 keeps only the first that many documents of each group
  // (LLaMA-Factory's max_samples, applied per dataset).
  std::vector<int> input_groups;
  int64_t max_documents_per_group = 0;
  TxtUnit txt_unit = TxtUnit::kFile;
  double val_fraction = 0.0;  // in [0, 1)
  int threads = 0;            // 0 = hardware concurrency
  int64_t shard_tokens = int64_t{1} << 28;
  bool add_special_tokens = false;  // HF's flag: the post-processor's BOS before each document
  // The id written after each document: -1 = the tokenizer's EOS. LLaMA-Factory's templates
  // change it at stage pt (train/hf/lf_template.h).
  int32_t separator_id = -1;
  bool skip_bad_lines = false;  // malformed JSONL lines: report and skip, instead of failing
  bool overwrite = false;       // replace an existing shard set in output_dir
  std::function<void(const TokenizeProgress&)> on_progress;  // called every chunk
  std::function<void(const std::string&)> on_warning;        // skipped lines ("file:line: why")
};

struct TokenizeReport {
  ShardSetMeta meta;
  int64_t bytes = 0, documents = 0, tokens = 0, bad_lines = 0;
  int64_t nulls = 0;  // null texts (JSON null, Parquet null), each an empty document (parquet_reader.h)
  std::vector<int64_t> group_documents;  // documents written per input group (dataset), in group order
  double seconds = 0;
};

// The .txt, .jsonl, .jsonl.gz, .jsonl.zst, .json and .parquet files named by `inputs` (folders searched recursively),
// sorted by path within each folder; errors name the input that does not exist or has another extension.
std::vector<std::string> list_input_files(const std::vector<std::string>& inputs);
// Whether kiln reads `path` by its extension: one of the file types above (the one list of them).
bool is_input_file(const std::string& path);

// All documents of options.inputs, read as tokenize_to_shards reads them (for benchmarks).
std::vector<std::string> read_documents(const TokenizeOptions& options);

TokenizeReport tokenize_to_shards(const Tokenizer& tokenizer, const TokenizeOptions& options);

// How a prompt is encoded for a model (kiln-generate; docs/data.md, "BOS"):
//   kAdd  the tokenizer's BOS, then the text (an error when it has none);
//   kNone the text alone;
//   kAuto as the model's training data was, when the checkpoint records it (kiln_data.json: the
//         tokenizer's template iff its shards were made with add_special_tokens, which kiln and
//         LLaMA-Factory's pretraining do not do); otherwise as HF's tokenizer(text): the
//         template of a tokenizer.json, nothing for the byte tokenizer.
enum class BosRule { kAuto, kAdd, kNone };
struct EncodedPrompt {
  std::vector<int32_t> ids;
  std::string rule;  // which rule decided, for messages
};
EncodedPrompt encode_prompt(const Tokenizer& tokenizer, std::string_view text, BosRule rule,
                            const std::optional<DataRecord>& record);

// The text of `generated` as it reads after `prompt` (kiln-generate prints the prompt, then this):
// decode(prompt + generated) less its decode(prompt) prefix, special tokens skipped, as
// transformers' text-generation pipeline cuts the prompt. This matters for SentencePiece
// decoders, whose Strip/Metaspace steps drop the leading space of a sequence: "▁world" alone
// decodes to "world", after "Hello" to " world". Where the prompt's text is not a prefix (a
// character cut between the two by byte-fallback tokens), decode(generated) alone.
std::string decode_continuation(const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                std::span<const int32_t> generated);

// How kiln-eval starts each scored block of a shard set (docs/data.md, "BOS"), by the same rules:
//   kAdd  the shards' BOS before every block (an error when they have none);
//   kNone the blocks as the shards hold them;
//   kAuto as the model was trained when the checkpoint records it (kiln_data.json: kiln packs
//         blocks from the shards and adds nothing); otherwise as HF's tokenizer(text) starts a
//         sequence: `tokenizer`'s template BOS when it has one and the shards' documents do not
//         already carry it (nullptr or the byte tokenizer: nothing).
struct BlockBos {
  int32_t id = -1;   // -1: none
  std::string rule;  // which rule decided, for the report
};
BlockBos block_bos(BosRule rule, const std::optional<DataRecord>& record, const Tokenizer* tokenizer,
                   const ShardSetMeta& shards);

}  // namespace kiln::data
