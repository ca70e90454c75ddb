// kiln-tokenize: text corpus -> token shards (lib/kiln/data/tokenize.h), plus two extra modes:
//   --default-corpus  build (or find) the embedded corpus's shards and print their folder;
//   --bench           time single- and multi-threaded encoding of the inputs (no output written),
//                     printed as one JSON line that scripts/bench_tokenizer.py sets beside HF's;
//   --decode FILE     print the text of each line's JSON list of ids (one JSON string per line).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "kiln/common/format.h"
#include "kiln/data/default_corpus.h"
#include "kiln/data/parquet_reader.h"
#include "kiln/data/tokenize.h"
#include "kiln/data/tokenizer.h"

namespace {

std::string duration(double s) {
  if (s < 0 || s > 1e7) return "?";
  const int t = static_cast<int>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}

void draw_progress(const kiln::data::TokenizeProgress& p) {
  const double frac = p.bytes_total > 0 ? std::min(1.0, static_cast<double>(p.bytes_done) / p.bytes_total) : 1.0;
  const double rate = p.seconds > 0 ? p.bytes_done / p.seconds : 0;
  const int width = 30, fill = static_cast<int>(frac * width);
  fmt::print(stderr, "\r[{}{}] {:5.1f}%  {}/s  {} tokens  ETA {}   ", std::string(fill, '#'),
             std::string(width - fill, '.'), 100 * frac, kiln::human_bytes(rate), kiln::with_commas(p.tokens),
             duration(rate > 0 ? (p.bytes_total - p.bytes_done) / rate : -1));
  std::fflush(stderr);
}

// Encodes every document with `threads` threads (documents dealt out in contiguous ranges);
// returns tokens per second over `repeat` passes.
double bench(const kiln::data::Tokenizer& tok, const std::vector<std::string>& docs, int threads, int repeat,
             int64_t& tokens) {
  std::vector<int64_t> counts(threads, 0);
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeat; ++r) {
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k) {
      pool.emplace_back([&, k] {
        std::vector<int32_t> ids;
        int64_t n = 0;
        for (size_t d = docs.size() * k / threads; d < docs.size() * (k + 1) / threads; ++d) {
          ids.clear();
          tok.encode_into(docs[d], ids);
          n += static_cast<int64_t>(ids.size());
        }
        counts[k] = n;
      });
    }
    for (auto& t : pool) t.join();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  tokens = 0;
  for (const auto c : counts) tokens += c;
  return static_cast<double>(tokens) * repeat / s;
}

}  // namespace

// Each mode reads its own options: one given to another mode, or two modes at once, would be
// silently ignored, so each is an error naming the option and the mode.
static void check_mode_options(const cxxopts::ParseResult& args) {
  const std::vector<std::pair<std::string, std::set<std::string>>> modes = {
      {"default-corpus", {"default-corpus", "output"}},
      {"decode", {"decode", "tokenizer", "eos", "skip-special-tokens"}},
      {"bench", {"bench", "repeat", "input", "tokenizer", "eos", "text-key", "txt-unit", "threads", "skip-bad-lines"}},
  };
  const std::set<std::string> not_tokenize = {"default-corpus", "decode", "skip-special-tokens", "bench", "repeat"};
  std::string mode;
  for (const auto& [name, reads] : modes) {
    if (!args.count(name)) continue;
    if (!mode.empty()) throw std::invalid_argument(fmt::format("give --{} or --{}, not both", mode, name));
    mode = name;
  }
  for (const auto& kv : args.arguments()) {
    const bool applies =
        mode.empty() ? not_tokenize.count(kv.key()) == 0 : std::find_if(modes.begin(), modes.end(), [&](const auto& m) {
                                                             return m.first == mode;
                                                           })->second.count(kv.key()) > 0;
    if (!applies) {
      throw std::invalid_argument(fmt::format("--{} does not apply to {} (kiln-tokenize --help)", kv.key(),
                                              mode.empty() ? "tokenizing" : "--" + mode));
    }
  }
}

int main(int argc, char** argv) {
  const std::string parquet = kiln::data::parquet_supported()
                                  ? fmt::format("read through Apache Arrow: {}", kiln::data::parquet_build_info())
                                  : fmt::format("NOT in this build: {}", kiln::data::parquet_build_info());
  cxxopts::Options options(
      "kiln-tokenize",
      fmt::format("Tokenize text files into kiln token shards. Inputs: .txt, .jsonl, .jsonl.gz, .jsonl.zst, .json "
                  "(an array or JSON Lines) and .parquet (a string column; {})",
                  parquet));
  // clang-format off
  options.add_options()
    ("tokenizer", "'byte' or a tokenizer.json (or its folder): byte-level BPE (GPT-2, Llama-3 style) or SentencePiece-BPE (Llama-2, Mistral, TinyLlama layouts)", cxxopts::value<std::string>()->default_value("byte"))
    ("eos", "EOS token content of an HF tokenizer (default: from tokenizer_config.json / well-known names)", cxxopts::value<std::string>())
    ("input", "input .txt/.jsonl/.jsonl.gz/.jsonl.zst/.json/.parquet files or folders (repeat or comma-separate)", cxxopts::value<std::vector<std::string>>())
    ("output", "output folder of the shard set", cxxopts::value<std::string>())
    ("text-key", "JSON field (Parquet column) holding the text; a null is an empty document", cxxopts::value<std::string>()->default_value("text"))
    ("txt-unit", "a .txt file is one document ('file') or each non-empty line is ('line')", cxxopts::value<std::string>()->default_value("file"))
    ("val-fraction", "fraction of documents for the 'val' split (every 1/F-th document)", cxxopts::value<double>()->default_value("0"))
    ("threads", "tokenizer threads (0 = all cores)", cxxopts::value<int>()->default_value("0"))
    ("shard-tokens", "tokens per shard (shards end at document ends)", cxxopts::value<int64_t>()->default_value("268435456"))
    ("add-special-tokens", "add the tokenizer's template tokens (e.g. BOS) to each document, as HF's add_special_tokens")
    ("skip-bad-lines", "report malformed JSONL lines and skip them instead of failing")
    ("overwrite", "replace an existing shard set in --output")
    ("no-progress", "no progress bar")
    ("default-corpus", "build (or find) the embedded default corpus's shards in a folder under --output (default: the cache) and print that folder")
    ("bench", "time encoding of --input single- and multi-threaded; prints a JSON line")
    ("repeat", "--bench: passes over the input", cxxopts::value<int>()->default_value("1"))
    ("decode", "print the text of each line of FILE, a JSON list of ids, as one JSON string per line (invalid UTF-8 as U+FFFD)", cxxopts::value<std::string>())
    ("skip-special-tokens", "--decode: leave special tokens out, as HF's decode(skip_special_tokens=True)")
    ("h,help", "print this help");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    check_mode_options(args);
    if (args.count("default-corpus")) {
      const std::string cache = args.count("output") ? args["output"].as<std::string>() : "";
      fmt::print("{}\n", kiln::data::default_corpus_shards(cache));
      return 0;
    }
    if (args.count("decode")) {
      const auto tokenizer =
          kiln::data::load_tokenizer(args["tokenizer"].as<std::string>(), kiln::cli::optional_string(args, "eos"));
      const auto path = args["decode"].as<std::string>();
      std::ifstream in(path);
      if (!in) throw std::invalid_argument(fmt::format("--decode: cannot open '{}'", path));
      std::string line;
      std::vector<int32_t> ids;
      for (int64_t n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const auto list = nlohmann::json::parse(line, nullptr, false);
        if (!list.is_array()) throw std::invalid_argument(fmt::format("{}:{}: not a JSON list of ids", path, n));
        ids.clear();
        for (const auto& v : list) {
          if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
            throw std::invalid_argument(fmt::format("{}:{}: {} is not a token id", path, n, v.dump()));
          ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
        }
        const std::string text = tokenizer->decode(ids, args.count("skip-special-tokens") > 0);
        std::cout << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      }
      return 0;
    }
    if (!args.count("input")) throw std::invalid_argument("--input: required (files or folders)");
    kiln::data::TokenizeOptions opt;
    opt.inputs = args["input"].as<std::vector<std::string>>();
    opt.text_key = args["text-key"].as<std::string>();
    const auto unit = args["txt-unit"].as<std::string>();
    if (unit != "file" && unit != "line")
      throw std::invalid_argument(fmt::format("--txt-unit must be file or line, got '{}'", unit));
    opt.txt_unit = unit == "file" ? kiln::data::TxtUnit::kFile : kiln::data::TxtUnit::kLine;
    opt.val_fraction = args["val-fraction"].as<double>();
    if (opt.val_fraction < 0 || opt.val_fraction >= 1)
      throw std::invalid_argument(fmt::format("--val-fraction must be in [0, 1), got {}", opt.val_fraction));
    opt.threads = args["threads"].as<int>();
    if (opt.threads < 0) throw std::invalid_argument(fmt::format("--threads must be >= 0, got {}", opt.threads));
    opt.shard_tokens = args["shard-tokens"].as<int64_t>();
    if (opt.shard_tokens <= 0)
      throw std::invalid_argument(fmt::format("--shard-tokens must be > 0, got {}", opt.shard_tokens));
    opt.skip_bad_lines = args.count("skip-bad-lines") > 0;
    opt.add_special_tokens = args.count("add-special-tokens") > 0;
    opt.overwrite = args.count("overwrite") > 0;
    const auto tokenizer =
        kiln::data::load_tokenizer(args["tokenizer"].as<std::string>(), kiln::cli::optional_string(args, "eos"));

    if (args.count("bench")) {
      const auto docs = kiln::data::read_documents(opt);
      const int threads =
          opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      const int repeat = args["repeat"].as<int>();
      if (repeat < 1) throw std::invalid_argument(fmt::format("--repeat must be >= 1, got {}", repeat));
      int64_t bytes = 0, tokens = 0;
      for (const auto& d : docs) bytes += static_cast<int64_t>(d.size());
      bench(*tokenizer, docs, 1, 1, tokens);  // warm-up (word caches, page faults)
      const double single = bench(*tokenizer, docs, 1, repeat, tokens);
      const double multi = bench(*tokenizer, docs, threads, repeat, tokens);
      fmt::print(
          "{{\"documents\": {}, \"bytes\": {}, \"tokens\": {}, \"threads\": {}, \"single_thread_tokens_per_s\": "
          "{:.1f}, "
          "\"multi_thread_tokens_per_s\": {:.1f}}}\n",
          docs.size(), bytes, tokens, threads, single, multi);
      return 0;
    }

    if (!args.count("output")) throw std::invalid_argument("--output: required (folder for the shard set)");
    opt.output_dir = args["output"].as<std::string>();
    const bool progress = !args.count("no-progress") && ::isatty(fileno(stderr));
    if (progress) opt.on_progress = draw_progress;
    int64_t warned = 0;
    opt.on_warning = [&](const std::string& m) {
      if (warned++ < 20) fmt::print(stderr, "{}kiln-tokenize: skipped {}\n", progress ? "\n" : "", m);
    };
    const auto report = kiln::data::tokenize_to_shards(*tokenizer, opt);
    if (progress) fmt::print(stderr, "\n");
    fmt::print("kiln-tokenize: {} documents, {} tokens ({}) from {} in {:.1f} s ({}/s), {} malformed lines skipped\n",
               kiln::with_commas(report.documents), kiln::with_commas(report.tokens),
               kiln::data::dtype_name(report.meta.dtype), kiln::human_bytes(static_cast<double>(report.bytes)),
               report.seconds, kiln::human_bytes(report.seconds > 0 ? report.bytes / report.seconds : 0),
               report.bad_lines);
    if (report.nulls > 0)
      fmt::print("  {} null texts read as empty documents (EOS only, as LLaMA-Factory)\n", report.nulls);
    for (const auto& s : report.meta.splits) {
      fmt::print("  {}: {} documents, {} tokens in {} shard(s)\n", s.name, kiln::with_commas(s.documents),
                 kiln::with_commas(s.tokens), s.shards.size());
    }
    fmt::print("  wrote {}/meta.json\n", opt.output_dir);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-tokenize: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
