// Datasets by name (LLaMA-Factory's dataset_info.json): see named_datasets.h.
#include "kiln/data/named_datasets.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "kiln/data/default_corpus.h"
#include "kiln/data/hash.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::vector<std::string> split_names(const std::string& names) {
  std::vector<std::string> out;
  std::stringstream ss(names);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    // A name listed twice is loaded once, where it first appears: LLaMA-Factory keeps the
    // datasets in a dict keyed by name (llamafactory/data/loader.py, _get_merged_dataset).
    if (!item.empty() && std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  return out;
}

// ".json", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".txt", ... (the last two
// extensions for a compressed file).
std::string file_type(const std::string& path) {
  const fs::path p(path);
  if (p.extension() == ".gz" || p.extension() == ".zst") return p.stem().extension().string() + p.extension().string();
  return p.extension().string();
}

// Bump when the shards made from the same inputs would change. 2: kiln_dataset.json records each
// dataset's documents.
constexpr int kCacheFormat = 2;

}  // namespace

std::vector<NamedDataset> parse_dataset_info(const std::string& json_text, const std::string& names,
                                             const std::string& dataset_dir, const std::string& source) {
  nlohmann::json info;
  try {
    info = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: invalid JSON ({})", source, e.what()));
  }
  if (!info.is_object()) throw std::runtime_error(fmt::format("{}: expected an object of datasets", source));
  const auto list = split_names(names);
  if (list.empty()) throw std::runtime_error(fmt::format("{}: no dataset named ('{}')", source, names));
  std::vector<NamedDataset> out;
  for (const std::string& name : list) {
    auto fail = [&](const std::string& problem) {
      throw std::runtime_error(fmt::format("{}: dataset '{}': {}", source, name, problem));
    };
    if (!info.contains(name)) fail("not defined (the file defines the datasets kiln can load by name)");
    const auto& e = info[name];
    if (!e.is_object()) fail("expected an object");
    for (const char* hub : {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"}) {
      if (e.contains(hub)) {
        fail(
            fmt::format("{} '{}': kiln has no network access; download the data first and name the local file "
                        "with file_name",
                        hub, e[hub].is_string() ? e[hub].get<std::string>() : e[hub].dump()));
      }
    }
    if (!e.contains("file_name") || !e["file_name"].is_string()) fail("no file_name (a file or folder in dataset_dir)");
    if (e.value("ranking", false)) fail("ranking datasets are for preference training; kiln does pretraining only");
    if (e.contains("formatting") && e["formatting"] != "alpaca") {
      fail(
          fmt::format("formatting {}: kiln's pretraining reads the text column of alpaca-formatted data "
                      "(columns.prompt) only",
                      e["formatting"].dump()));
    }
    if (e.contains("num_samples")) fail("num_samples (random sampling) is not supported; use max_samples");
    if (e.contains("split")) {
      // LLaMA-Factory hands `split` to datasets.load_dataset; a local file's one split is "train".
      // Slices ("train[:10]", "train[10%:]") select rows there, before max_samples; kiln does not
      // read them, so anything but the whole train split is refused rather than ignored.
      if (!e["split"].is_string() || e["split"].get<std::string>() != "train") {
        fail(
            fmt::format("split {}: kiln reads the whole train split of a local dataset (split \"train\"); slices "
                        "and other splits are not supported: cut the file, or use max_samples for its first rows",
                        e["split"].dump()));
      }
    }
    NamedDataset d;
    d.name = name;
    if (e.contains("columns")) {
      const auto& c = e["columns"];
      if (!c.is_object()) fail("columns: expected an object");
      if (c.contains("prompt")) {
        if (!c["prompt"].is_string()) fail("columns.prompt: expected a string");
        d.text_column = c["prompt"].get<std::string>();
      }
      if (c.contains("query")) fail("columns.query: kiln's pretraining reads one text column (columns.prompt)");
    }
    const std::string file_name = e["file_name"].get<std::string>();
    const fs::path path = fs::path(dataset_dir) / file_name;
    if (file_name.empty()) fail("file_name is empty (a file or folder in dataset_dir)");
    if (fs::is_directory(path)) {
      for (const auto& f : fs::directory_iterator(path)) {
        if (f.is_regular_file()) d.files.push_back(f.path().string());
      }
      std::sort(d.files.begin(), d.files.end());
      if (d.files.empty()) fail(fmt::format("file_name '{}': folder '{}' holds no files", file_name, path.string()));
    } else if (fs::is_regular_file(path)) {
      d.files.push_back(path.string());
    } else {
      fail(fmt::format("file_name '{}': '{}' not found", file_name, path.string()));
    }
    const std::string ext = file_type(d.files[0]);
    for (const auto& f : d.files) {
      const std::string x = file_type(f);
      if (!is_input_file(f)) {
        fail(
            fmt::format("file_name '{}': '{}': kiln reads .json (an array or JSON Lines), .jsonl, .jsonl.gz, "
                        ".jsonl.zst, .parquet and .txt files",
                        file_name, f));
      }
      if (x != ext)
        fail(fmt::format("file_name '{}': '{}': the files of one dataset must have one type ({})", file_name, f, ext));
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<NamedDataset> resolve_datasets(const std::string& names, const std::string& dataset_dir) {
  const fs::path file = fs::path(dataset_dir) / "dataset_info.json";
  std::ifstream in(file);
  if (!in)
    throw std::runtime_error(
        fmt::format("dataset '{}': cannot open {} (dataset_dir names the folder of "
                    "LLaMA-Factory's dataset_info.json; default: data)",
                    names, file.string()));
  std::stringstream text;
  text << in.rdbuf();
  return parse_dataset_info(text.str(), names, dataset_dir, file.string());
}

std::string named_datasets_key(const Tokenizer& tokenizer, const std::vector<NamedDataset>& datasets,
                               int64_t max_samples, int32_t separator_id) {
  uint64_t h = xxh64(fmt::format("kiln-named-datasets {} {} {}", kCacheFormat, tokenizer.fingerprint(), max_samples));
  if (separator_id >= 0) h = xxh64(fmt::format("separator {}", separator_id), h);
  std::vector<char> buffer(size_t{1} << 20);
  for (const auto& d : datasets) {
    h = xxh64(d.text_column, xxh64(fmt::format("dataset {}", d.files.size()), h));
    for (const auto& f : d.files) {
      // The file's content (and type: .txt is read by lines) and size, not its path.
      std::ifstream in(f, std::ios::binary);
      if (!in) throw std::runtime_error(fmt::format("'{}': cannot open", f));
      uint64_t fh = xxh64(file_type(f));
      while (in) {
        in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
        fh = xxh64(buffer.data(), static_cast<size_t>(in.gcount()), fh);
      }
      h = xxh64(&fh, sizeof fh, h);
    }
  }
  return hex64(h);
}

PreparedDatasets prepare_named_datasets(const Tokenizer& tokenizer, const std::vector<NamedDataset>& datasets,
                                        const NamedDatasetOptions& options) {
  PreparedDatasets out;
  for (const auto& d : datasets) out.names.push_back(d.name);
  out.key = named_datasets_key(tokenizer, datasets, options.max_samples, options.separator_id);
  std::string names;
  for (const auto& d : datasets) names += (names.empty() ? "" : "+") + d.name;
  const fs::path dir = !options.tokenized_path.empty()
                           ? fs::path(options.tokenized_path)
                           : fs::path(options.cache_dir.empty() ? default_cache_dir() : options.cache_dir) /
                                 "datasets" / fmt::format("{}-{}", names.substr(0, 80), out.key);
  out.shard_dir = dir.string();
  auto info = [&](const std::string& line) {
    if (options.on_info) options.on_info(line);
  };
  const fs::path record = dir / "kiln_dataset.json";
  std::string stored;
  if (fs::exists(dir / "meta.json") && fs::exists(record)) {
    try {
      std::ifstream in(record);
      stored = nlohmann::json::parse(in).value("key", "");
    } catch (const std::exception&) {
    }
  }
  if (options.reuse_only) {
    if (stored != out.key) {
      throw std::runtime_error(fmt::format("datasets {}: {} does not hold the shards prepared for them (key {}{})",
                                           names, dir.string(), out.key,
                                           stored.empty() ? "" : fmt::format("; it holds key {}", stored)));
    }
    info(fmt::format("datasets {}: using the shards rank 0 prepared in {} (key {})", names, dir.string(), out.key));
    out.documents = named_dataset_documents(out.shard_dir);
    return out;
  }
  if (stored == out.key && !options.overwrite_cache) {
    info(fmt::format("datasets {}: reusing the tokenized shards in {} (key {}; overwrite_cache: true tokenizes again)",
                     names, dir.string(), out.key));
    out.documents = named_dataset_documents(out.shard_dir);
    return out;
  }
  if (fs::exists(dir) && !fs::is_empty(dir) && !fs::exists(dir / "meta.json") && !fs::exists(record)) {
    throw std::runtime_error(fmt::format(
        "tokenized_path '{}' exists and is not a kiln shard folder; name an empty or new folder", dir.string()));
  }
  if (!stored.empty() && stored != out.key && !options.tokenized_path.empty()) {
    info(fmt::format("tokenized_path {} holds other data (key {}, now {}): tokenizing again", dir.string(), stored,
                     out.key));
  }

  TokenizeOptions t;
  for (size_t i = 0; i < datasets.size(); ++i) {
    for (const auto& f : datasets[i].files) {
      t.inputs.push_back(f);
      t.input_text_keys.push_back(datasets[i].text_column);
      t.input_groups.push_back(static_cast<int>(i));
    }
  }
  t.txt_unit = TxtUnit::kLine;  // HF's text loader: one example per line
  t.max_documents_per_group = options.max_samples;
  t.on_progress = options.on_progress;
  t.separator_id = options.separator_id;
  // Built beside the destination and renamed into place: a crash never leaves a folder that
  // looks complete, and concurrent processes (ranks) each build their own and one wins.
  const fs::path tmp = dir.parent_path() / fmt::format(".{}.tmp{}", dir.filename().string(), ::getpid());
  fs::create_directories(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  fs::remove_all(tmp);
  t.output_dir = tmp.string();
  try {
    out.report = tokenize_to_shards(tokenizer, t);
    std::ofstream rec(tmp / "kiln_dataset.json");
    nlohmann::json j = {{"key", out.key}, {"tokenizer", tokenizer.name()}, {"max_samples", options.max_samples}};
    out.documents = out.report.group_documents;
    out.documents.resize(datasets.size(), 0);
    if (options.separator_id >= 0) j["separator_id"] = options.separator_id;
    for (size_t i = 0; i < datasets.size(); ++i) {
      const auto& d = datasets[i];
      j["datasets"].push_back(
          {{"name", d.name}, {"files", d.files}, {"column", d.text_column}, {"documents", out.documents[i]}});
    }
    rec << j.dump(1) << "\n";
    rec.close();
    if (!rec) throw std::runtime_error(fmt::format("'{}': cannot write kiln_dataset.json", tmp.string()));
    if (fs::exists(dir)) fs::remove_all(dir);
    std::error_code ec;
    fs::rename(tmp, dir, ec);
    if (ec) {
      fs::remove_all(tmp);
      if (!fs::exists(dir / "meta.json"))
        throw std::runtime_error(fmt::format("'{}': cannot create: {}", dir.string(), ec.message()));
    }
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  out.tokenized = true;
  info(fmt::format(
      "datasets {}: tokenized {} documents, {} tokens ({} bytes) in {:.2f} s into {} (key {}){}", names,
      out.report.documents, out.report.tokens, out.report.bytes, out.report.seconds, dir.string(), out.key,
      out.report.nulls > 0 ? fmt::format("; {} null texts read as empty documents", out.report.nulls) : ""));
  return out;
}

std::vector<int64_t> named_dataset_documents(const std::string& shard_dir) {
  const fs::path file = fs::path(shard_dir) / "kiln_dataset.json";
  std::vector<int64_t> out;
  try {
    std::ifstream in(file);
    if (!in) throw std::runtime_error("cannot open");
    const auto j = nlohmann::json::parse(in);
    for (const auto& d : j.at("datasets")) out.push_back(d.at("documents").get<int64_t>());
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "{}: no documents per dataset recorded ({}); overwrite_cache: true tokenizes again", file.string(), e.what()));
  }
  return out;
}

}  // namespace kiln::data
