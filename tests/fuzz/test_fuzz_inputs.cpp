// Fuzzing of every input kiln reads from a user or from disk that the earlier fuzzing did not cover:
// dataset_info.json, .json/.jsonl(.gz/.zst) and .parquet datasets, the files a resume reads
// (trainer_state.json, loader_state.json, kiln_state.json, kiln_data.json, the weights', the
// optimizer's and the random generator's safetensors, and a rank's optimizer shard), and the YAML
// front end. (tokenizer.json, byte-level and SentencePiece, is fuzzed in tests/data/test_hf_tokenizer_input.cpp.)
//
// Each case mutates a valid file a few hundred times (tests/fuzz/mutate.h). The contract, for every
// mutation: it loads, or it fails with one exception whose message is one line naming the file; a
// mutation that changed or deleted a known key and is refused names that key (the field); a
// refused resume leaves output_dir exactly as it was. A crash fails the run itself. The counts per
// format are printed (docs/training.md, "Fuzzed inputs", has a run's figures).
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <zlib.h>
#include <zstd.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/config/yaml.h"
#include "kiln/data/byte_tokenizer.h"
#include "kiln/data/named_datasets.h"
#include "kiln/data/parquet_reader.h"
#include "kiln/data/tokenize.h"
#include "kiln/io/safetensors.h"
#include "kiln/kiln.h"
#include "kiln/train/trainer.h"
#include "mutate.h"
#include "support.h"

namespace fs = std::filesystem;
using kiln::test::Mutation;

namespace {

const fs::path kFixtures = KILN_TEST_FIXTURES;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// The message of what `fn` throws, without LibTorch's C++ backtrace; nullopt when it loads.
template <typename Fn>
std::optional<std::string> refusal(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// Counts per format, and the checks of one outcome.
struct Tally {
  std::string format;
  int loaded = 0, refused = 0, keyed = 0, named_key = 0;

  void record(const Mutation& m, const std::optional<std::string>& error, const std::string& file_name,
              bool require_key = true) {
    if (!error) {
      ++loaded;
      return;
    }
    ++refused;
    CAPTURE(format, m.kind, m.key, m.text.substr(0, 400), *error);
    CHECK(error->find('\n') == std::string::npos);  // one line
    CHECK_THAT(*error, Catch::Contains(file_name));
    if (!m.key.empty() && (m.kind == "type" || m.kind == "delete" || m.kind == "number" || m.kind == "yaml-value")) {
      ++keyed;
      // A YAML value that breaks the document's syntax is located by line (yaml-cpp's parser).
      const bool names = error->find(m.key) != std::string::npos ||
                         (m.kind == "yaml-value" && error->find("line ") != std::string::npos);
      named_key += names;
      if (require_key) CHECK(names);
    }
  }
  ~Tally() {
    WARN(
        fmt::format("fuzz {}: {} mutations, {} loaded, {} refused with one line naming the file; {} of {} refusals "
                    "of a changed key name it",
                    format, loaded + refused, loaded, refused, named_key, keyed));
  }
};

std::string gzip(const std::string& text) {
  z_stream z{};
  deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3));
  return out;
}

std::string jsonl_corpus() {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text +=
        nlohmann::json{{"text", fmt::format("document {} of the fuzzed corpus, with words {}", i, i * i)}, {"id", i}}
            .dump() +
        "\n";
  }
  return text;
}

// A JSONL file mutated: one line mutated as JSON, or the whole file's bytes.
Mutation mutate_jsonl(const std::string& valid, std::mt19937& rng) {
  if (rng() % 3 == 0) return kiln::test::mutate_bytes(valid, rng);
  std::vector<std::string> lines;
  std::stringstream ss(valid);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  const size_t i = rng() % lines.size();
  Mutation m = kiln::test::mutate_json(lines[i], rng);
  std::string json_line = m.text;
  json_line.erase(std::remove(json_line.begin(), json_line.end(), '\n'), json_line.end());
  lines[i] = json_line;
  m.text.clear();
  for (const auto& l : lines) m.text += l + "\n";
  return m;
}

kiln::data::TokenizeReport tokenize_one(const fs::path& file, const fs::path& out) {
  const kiln::data::ByteTokenizer tok;
  kiln::data::TokenizeOptions opt;
  opt.inputs = {file.string()};
  opt.output_dir = out.string();
  opt.overwrite = true;
  opt.threads = 1;
  return kiln::data::tokenize_to_shards(tok, opt);
}

// Every file under `dir` with its size and content hash: what "nothing lost" compares.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    out[fs::relative(e.path(), dir).string()] = std::to_string(std::hash<std::string>{}(slurp(e.path())));
  }
  return out;
}

}  // namespace

TEST_CASE("fuzzed dataset_info.json files resolve or are refused naming the file and the key", "[fuzz][data]") {
  const fs::path dir = kiln::test::scratch_dir("fuzz_dataset_info");
  spit(dir / "a.jsonl", jsonl_corpus());
  fs::create_directories(dir / "folder");
  spit(dir / "folder" / "b.jsonl", jsonl_corpus());
  const nlohmann::json valid = {
      {"alpha", {{"file_name", "a.jsonl"}, {"columns", {{"prompt", "text"}}}}},
      {"beta", {{"file_name", "folder"}, {"formatting", "alpaca"}, {"columns", {{"prompt", "text"}}}}}};
  std::mt19937 rng(27001);
  Tally t{"dataset_info.json"};
  for (int trial = 0; trial < 300; ++trial) {
    const Mutation m = kiln::test::mutate_json(valid.dump(1), rng);
    spit(dir / "dataset_info.json", m.text);
    // Keys that only matter for another dataset, or that a loader ignores, may load.
    const auto e = refusal([&] { kiln::data::resolve_datasets("alpha,beta", dir.string()); });
    t.record(m, e, "dataset_info.json");
  }
}

TEST_CASE("fuzzed .json and .jsonl datasets tokenize or are refused naming the file", "[fuzz][data]") {
  const fs::path dir = kiln::test::scratch_dir("fuzz_jsonl");
  const std::string jsonl = jsonl_corpus();
  std::string json = "[";
  {
    std::stringstream ss(jsonl);
    bool first = true;
    for (std::string l; std::getline(ss, l); first = false) json += (first ? "" : ",\n") + l;
    json += "]\n";
  }
  std::mt19937 rng(27002);
  for (const std::string ext : {".jsonl", ".json", ".jsonl.gz", ".jsonl.zst"}) {
    Tally t{"dataset" + ext};
    const fs::path file = dir / ("data" + ext);
    for (int trial = 0; trial < 250; ++trial) {
      Mutation m;
      if (ext == ".json") {
        m = kiln::test::mutate_json(json, rng);
      } else {
        m = mutate_jsonl(jsonl, rng);
      }
      std::string bytes = m.text;
      if (ext == ".jsonl.gz" || ext == ".jsonl.zst") {
        // Half: the content mutated, then compressed; half: the compressed bytes mutated.
        const std::string packed = ext == ".jsonl.gz" ? gzip(jsonl) : zstd(jsonl);
        if (trial % 2 == 0) {
          bytes = ext == ".jsonl.gz" ? gzip(m.text) : zstd(m.text);
        } else {
          m = kiln::test::mutate_bytes(packed, rng);
          bytes = m.text;
        }
      }
      spit(file, bytes);
      // A value's type is checked only for the text column ("text"); other keys are not read.
      const auto e = refusal([&] { tokenize_one(file, dir / "out"); });
      if (m.key != "text") m.key.clear();
      t.record(m, e, file.filename().string());
    }
  }
}

TEST_CASE("fuzzed .parquet datasets tokenize or are refused naming the file", "[fuzz][data][parquet]") {
  if (!kiln::data::parquet_supported()) return;  // tests/data/test_readers.cpp checks the refusal
  const fs::path dir = kiln::test::scratch_dir("fuzz_parquet");
  const std::string valid = slurp(kFixtures / "readers.parquet");
  std::mt19937 rng(27003);
  Tally t{".parquet"};
  for (int trial = 0; trial < 300; ++trial) {
    const Mutation m = kiln::test::mutate_bytes(valid, rng);
    spit(dir / "data.parquet", m.text);
    t.record(m, refusal([&] { tokenize_one(dir / "data.parquet", dir / "out"); }), "data.parquet");
  }
}

TEST_CASE("fuzzed YAML configs load or are refused naming the file and the key", "[fuzz][config]") {
  const fs::path dir = kiln::test::scratch_dir("fuzz_yaml");
  const std::string quickstart = slurp(fs::path(KILN_TEST_FIXTURES).parent_path().parent_path().parent_path() /
                                       "configs" / "pretrain" / "quickstart.yaml");
  const std::string lf = slurp(kFixtures / "lf_pretrain_issue15.yaml");
  REQUIRE(!quickstart.empty());
  std::mt19937 rng(27004);
  Tally t{"pretrain YAML"};
  for (int trial = 0; trial < 300; ++trial) {
    const Mutation m = kiln::test::mutate_yaml(trial % 2 ? quickstart : lf, rng);
    const fs::path file = dir / "run.yaml";
    spit(file, m.text);
    t.record(m, refusal([&] { kiln::train::load_pretrain_config(file.string(), {}); }), "run.yaml");
  }
}

namespace {
void fuzz_resume(int trials_per_file, const std::string& name_of_run) {
  // A real checkpoint of two steps to resume from.
  kiln::train::PretrainConfig c;
  c.model = "tiny";
  c.cutoff_len = 32;
  c.per_device_train_batch_size = 2;
  c.max_steps = 4;
  c.save_steps = 2;
  c.logging_steps = 1;
  c.device = "cpu";
  c.output_dir = kiln::test::scratch_dir(name_of_run).string();
  kiln::train::Trainer(c).train();
  const fs::path ckpt = fs::path(c.output_dir) / "checkpoint-2";
  REQUIRE(fs::exists(ckpt / "trainer_state.json"));
  c.resume_from_checkpoint = ckpt.string();
  const std::map<std::string, std::string> before = snapshot(c.output_dir);
  std::mt19937 rng(27005);
  // (config.json is not read by a resume: the run's model config is its own YAML's, as in HF's Trainer.)
  const std::vector<std::string> files = {"trainer_state.json", "loader_state.json",     "kiln_state.json",
                                          "kiln_data.json",     "rng_state.safetensors", "optimizer.safetensors",
                                          "model.safetensors"};
  for (const std::string& name : files) {
    Tally t{"checkpoint " + name};
    const std::string valid = slurp(ckpt / name);
    REQUIRE(!valid.empty());
    for (int trial = 0; trial < trials_per_file; ++trial) {
      const bool json = name.ends_with(".json");
      const Mutation m = json ? kiln::test::mutate_json(valid, rng) : kiln::test::mutate_bytes(valid, rng);
      spit(ckpt / name, m.text);
      const auto e = refusal([&] { kiln::train::Trainer resumed(c); });
      // A value the resume does not read (trainer_state.json carries HF's fields for other tools) loads.
      t.record(m, e, name, /*require_key=*/json);
      spit(ckpt / name, valid);
    }
  }
  // Nothing a refused (or accepted but unused) resume did touched the folder.
  CHECK(snapshot(c.output_dir) == before);
}
}  // namespace

// Each mutation constructs a resuming Trainer (about a quarter of a second on 2 cores): the default
// suite runs 40 per file, the [slow] run 200 (the figures in docs/training.md).
TEST_CASE("fuzzed files of a checkpoint refuse the resume naming the file, and output_dir keeps every byte",
          "[fuzz][train]") {
  fuzz_resume(40, "fuzz_resume");
}

TEST_CASE("fuzzed files of a checkpoint, 200 mutations each", "[fuzz][train][slow]") {
  fuzz_resume(200, "fuzz_resume_long");
}

namespace {
// The same torch.save archive with its pickle (data.pkl) replaced: the records are copied, so the
// mutation reaches LibTorch's unpickler instead of the zip reader's checks.
std::string with_pickle(const fs::path& file, const std::string& pickle) {
  caffe2::serialize::PyTorchStreamReader reader(file.string());
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) -> size_t {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/version" || name == "byteorder" || name == ".data/serialization_id") {
      continue;  // the writer writes its own
    }
    if (name == "data.pkl") {
      writer.writeRecord(name, pickle.data(), pickle.size());
    } else {
      const auto [data, size] = reader.getRecord(name);
      writer.writeRecord(name, data.get(), size);
    }
  }
  writer.writeEndOfFile();
  return out;
}
}  // namespace

// kiln's checkpoint less kiln's own files is one of transformers' Trainer: the resume reads
// optimizer.pt and scheduler.pt through LibTorch's unpickler. Mutated archives (bytes anywhere, or
// a valid archive around a mutated pickle) load or are refused in one line naming the file.
TEST_CASE("fuzzed optimizer.pt and scheduler.pt of a transformers checkpoint refuse the resume naming the file",
          "[fuzz][train]") {
  kiln::train::PretrainConfig c;
  c.model = "tiny";
  c.cutoff_len = 32;
  c.per_device_train_batch_size = 2;
  c.max_steps = 4;
  c.save_steps = 2;
  c.logging_steps = 1;
  c.device = "cpu";
  c.output_dir = kiln::test::scratch_dir("fuzz_hf_resume").string();
  kiln::train::Trainer(c).train();
  const fs::path ckpt = fs::path(c.output_dir) / "checkpoint-2";
  for (const char* kiln_file :
       {"kiln_state.json", "loader_state.json", "optimizer.safetensors", "kiln_data.json", "rng_state.safetensors"}) {
    REQUIRE(fs::remove(ckpt / kiln_file));
  }
  c.resume_from_checkpoint = ckpt.string();
  CHECK(!refusal([&] { kiln::train::Trainer resumed(c); }));  // the valid checkpoint resumes
  std::mt19937 rng(27007);
  for (const std::string name : {"optimizer.pt", "scheduler.pt"}) {
    Tally t{"transformers checkpoint " + name};
    const std::string valid = slurp(ckpt / name);
    std::string pickle;
    {
      caffe2::serialize::PyTorchStreamReader reader((ckpt / name).string());
      const auto [data, size] = reader.getRecord("data.pkl");
      pickle.assign(static_cast<const char*>(data.get()), size);
    }
    for (int trial = 0; trial < 15; ++trial) {  // each resume takes about a second on 2 busy cores
      Mutation m = kiln::test::mutate_bytes(trial % 3 == 0 ? valid : pickle, rng);
      if (trial % 3 != 0) m.text = with_pickle(ckpt / name, m.text);
      spit(ckpt / name, m.text);
      t.record(m, refusal([&] { kiln::train::Trainer resumed(c); }), name, /*require_key=*/false);
      spit(ckpt / name, valid);
    }
  }
}

TEST_CASE("a fuzzed optimizer shard of a data-parallel checkpoint is refused naming the file", "[fuzz][io]") {
  // The rank files (optimizer.rank-R-of-W.safetensors, rng_state_R.safetensors) are safetensors
  // files read by the same reader as above; fuzzed here through it directly, as a resume reads them.
  const fs::path dir = kiln::test::scratch_dir("fuzz_rank_files");
  const fs::path file = dir / "optimizer.rank-00001-of-00002.safetensors";
  kiln::io::save_safetensors(file.string(), {{"model.norm.weight.exp_avg", at::randn({128})},
                                             {"model.norm.weight.exp_avg_sq", at::rand({128})},
                                             {"model.norm.weight.step", at::full({}, 3.0)}});
  const std::string valid = slurp(file);
  std::mt19937 rng(27006);
  Tally t{"optimizer rank shard"};
  for (int trial = 0; trial < 300; ++trial) {
    // The JSON header mutated as JSON half the time (after its 8-byte length, re-measured).
    Mutation m;
    if (trial % 2 == 0) {
      const uint64_t n = *reinterpret_cast<const uint64_t*>(valid.data());
      m = kiln::test::mutate_json(valid.substr(8, n), rng);
      uint64_t len = m.text.size();
      m.text = std::string(reinterpret_cast<const char*>(&len), 8) + m.text + valid.substr(8 + n);
    } else {
      m = kiln::test::mutate_bytes(valid, rng);
    }
    spit(file, m.text);
    const auto e = refusal([&] {
      kiln::io::SafetensorsFile f(file.string());
      for (const auto& name : f.names()) (void)f.tensor(name).sum().item<double>();
    });
    t.record(m, e, file.filename().string(), /*require_key=*/false);
  }
}
