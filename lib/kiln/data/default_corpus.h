// The embedded default corpus (data/corpus/*.jsonl, written by scripts/make_corpus.py from
// kiln's own docs and sources plus generated English passages). It is compiled into the library
// so the quick start trains on real text with no download and no source tree; its byte-tokenizer
// shards are built on first use into a cache folder keyed by the corpus's hash.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

struct EmbeddedFile {
  std::string_view name;  // e.g. "stories.jsonl"
  std::string_view text;
};
std::vector<EmbeddedFile> embedded_corpus();

// $KILN_HOME/data, else $HOME/.cache/kiln/data.
std::string default_cache_dir();

// Folder of the embedded corpus's shards (byte tokenizer, 2% validation split): built on the
// first call (atomically: a temporary folder renamed into place), reused afterwards.
std::string default_corpus_shards(const std::string& cache_dir = "");

}  // namespace kiln::data
