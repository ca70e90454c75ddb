// kiln-tokenize: text corpus -> token shards (lib/kiln/data/tokenize.h), plus three extra modes
// (keys: settings.h; each mode refuses the keys it does not read):
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
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "kiln/common/format.h"
#include "kiln/data/default_corpus.h"
#include "kiln/data/parquet_reader.h"
#include "kiln/data/tokenize.h"
#include "kiln/data/tokenizer.h"
#include "settings.h"

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

int main(int argc, char** argv) {
  const std::string parquet = kiln::data::parquet_supported()
                                  ? fmt::format("read through Apache Arrow: {}", kiln::data::parquet_build_info())
                                  : fmt::format("NOT in this build: {}", kiln::data::parquet_build_info());
  try {
    const auto line =
        kiln::config::parse_command_line(kiln::cli::arguments(argc, argv), kiln::cli::tokenize_spelling());
    if (line.help) {
      std::cout << kiln::cli::settings_help(
          fmt::format("Usage: kiln-tokenize --input PATH --output_dir DIR [--KEY VALUE ...]\n"
                      "       kiln-tokenize --default_corpus [--output_dir DIR]\n"
                      "       kiln-tokenize --decode FILE [--tokenizer T]\n"
                      "       kiln-tokenize --bench --input PATH [--KEY VALUE ...]\n\n"
                      "Tokenize text files into kiln token shards. Inputs: .txt, .jsonl, .jsonl.gz, .jsonl.zst, .json "
                      "(an array or JSON Lines)\nand .parquet (a string column; {})",
                      parquet),
          kiln::cli::tokenize_keys());
      return 0;
    }
    const kiln::cli::TokenizeSettings args = kiln::cli::read_tokenize_settings(line);
    if (args.default_corpus) {
      fmt::print("{}\n", kiln::data::default_corpus_shards(args.output_dir));
      return 0;
    }
    if (!args.decode.empty()) {
      const auto tokenizer = kiln::data::load_tokenizer(args.tokenizer, args.eos);
      const std::string& path = args.decode;
      std::ifstream in(path);
      if (!in) args.given.fail("decode", fmt::format("cannot open '{}'", path));
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
        const std::string text = tokenizer->decode(ids, args.skip_special_tokens);
        std::cout << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      }
      return 0;
    }
    kiln::data::TokenizeOptions opt;
    opt.inputs = args.input;
    opt.text_key = args.text_key;
    opt.txt_unit = args.txt_unit == "file" ? kiln::data::TxtUnit::kFile : kiln::data::TxtUnit::kLine;
    opt.val_fraction = args.val_fraction;
    opt.threads = static_cast<int>(args.threads);
    opt.shard_tokens = args.shard_tokens;
    opt.skip_bad_lines = args.skip_bad_lines;
    opt.add_special_tokens = args.add_special_tokens;
    opt.overwrite = args.overwrite;
    const auto tokenizer = kiln::data::load_tokenizer(args.tokenizer, args.eos);

    if (args.bench) {
      const auto docs = kiln::data::read_documents(opt);
      const int threads =
          opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      const int repeat = static_cast<int>(args.repeat);
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

    opt.output_dir = args.output_dir;
    const bool progress = args.progress && ::isatty(fileno(stderr));
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
