// Coming from LLaMA-Factory: its keys are acted on, accepted with one info line, or refused
// naming what kiln supports (train/hf/lf_keys.h); its dataset_info.json resolves datasets by name and
// they are tokenized into a cache keyed by content (data/named_datasets.h). References:
// LLaMA-Factory's hparams and data/parser.py (key names, hub entries, file_name as a file or a
// folder, columns.prompt), its pretraining preprocessing (text + EOS, no BOS, max_samples per
// dataset), HF's train_test_split (val_size: a random subset of the packed examples).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include <zlib.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/data/byte_tokenizer.h"
#include "kiln/data/loader.h"
#include "kiln/data/named_datasets.h"
#include "kiln/data/shards.h"
#include "kiln/train/hf/lf_keys.h"
#include "kiln/train/pretrain_config.h"
#include "support.h"

using Catch::Matchers::Contains;
using kiln::test::error_of;
using kiln::train::classify_lf_key;
using kiln::train::LfKeyClass;
namespace fs = std::filesystem;

TEST_CASE("LLaMA-Factory keys: acted on, accepted with a reason, or refused naming what kiln does", "[config]") {
  CHECK(classify_lf_key("stage", "pt")->cls == LfKeyClass::kActed);
  CHECK(classify_lf_key("finetuning_type", "full")->cls == LfKeyClass::kActed);
  CHECK(classify_lf_key("optim", "adamw_torch")->cls == LfKeyClass::kActed);
  for (const char* stage : {"sft", "rm", "ppo", "dpo", "kto"}) {
    const auto v = classify_lf_key("stage", stage);
    CHECK(v->cls == LfKeyClass::kRefused);
    CHECK_THAT(v->message, Contains(stage) && Contains("stage: pt"));
  }
  for (const char* type : {"lora", "freeze"}) {
    CHECK_THAT(classify_lf_key("finetuning_type", type)->message, Contains(type) && Contains("finetuning_type: full"));
  }
  CHECK(classify_lf_key("lora_rank", "16")->cls == LfKeyClass::kRefused);  // 8, LLaMA-Factory's default, is inert
  CHECK(classify_lf_key("do_train", "false")->cls == LfKeyClass::kRefused);
  CHECK(classify_lf_key("eval_strategy", "epoch")->cls == LfKeyClass::kRefused);
  // No effect: one reason each; the defaults of the value-dependent ones are silent.
  for (const char* key : {"trust_remote_code", "dataloader_pin_memory", "template"}) {
    const auto v = classify_lf_key(key, "16");
    CHECK(v->cls == LfKeyClass::kNoEffect);
    CHECK_FALSE(v->message.empty());
  }
  // report_to as HF reads it: none, tensorboard, all, or a list; HF's other integrations are
  // dropped with a warning, an unknown name is refused. plot_loss and logging_dir are config fields.
  CHECK(classify_lf_key("report_to", "none")->message.empty());
  CHECK(classify_lf_key("report_to", "none")->cls == LfKeyClass::kNoEffect);
  CHECK(classify_lf_key("report_to", "tensorboard")->cls == LfKeyClass::kActed);
  CHECK(classify_lf_key("report_to", "tensorboard")->message.empty());
  CHECK_THAT(classify_lf_key("report_to", "all")->message, Contains("tensorboard"));
  const auto wandb = classify_lf_key("report_to", "wandb");
  CHECK(wandb->cls == LfKeyClass::kNoEffect);
  CHECK_THAT(wandb->message, Contains("warning") && Contains("wandb") && Contains("ignored"));
  const auto both = classify_lf_key("report_to", "wandb,tensorboard");
  CHECK(both->cls == LfKeyClass::kActed);
  CHECK_THAT(both->message, Contains("wandb") && Contains("TensorBoard event files are written"));
  const auto typo = classify_lf_key("report_to", "tensorbord");
  CHECK(typo->cls == LfKeyClass::kRefused);
  CHECK_THAT(typo->message, Contains("'tensorbord'") && Contains("tensorboard"));
  CHECK_FALSE(classify_lf_key("plot_loss", "true"));
  CHECK_FALSE(classify_lf_key("logging_dir", "runs"));
  CHECK_FALSE(classify_lf_key("learning_rat", "1"));
  // No key is both a PretrainConfig field and a table entry.
  const auto& fields = kiln::train::pretrain_config_keys();
  for (const auto& k : kiln::train::lf_keys()) {
    CAPTURE(k);
    CHECK(std::find(fields.begin(), fields.end(), k) == fields.end());
  }
}

TEST_CASE("the LLaMA-Factory pretraining YAML of issue 15 loads; a misspelled key is still an error", "[config]") {
  // The issue's file (tests/data/fixtures), its model line pointed at a preset.
  std::ifstream in(KILN_TEST_FIXTURES "/lf_pretrain_issue15.yaml");
  REQUIRE(in);
  std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string hf_dir = "model_name_or_path: path/to/hf-dir";
  REQUIRE(yaml.find(hf_dir) != std::string::npos);
  yaml.replace(yaml.find(hf_dir), hf_dir.size(), "model: tiny");
  const auto c = kiln::train::pretrain_config_from_yaml_text(yaml, "lf.yaml");
  CHECK(c.dataset == "c4_demo");
  CHECK(c.max_samples == 1000);
  CHECK(c.overwrite_cache);
  CHECK(c.eval_steps == 500);
  CHECK(c.ddp_timeout == 180000000);
  CHECK(c.plot_loss);
  CHECK(c.report_to_tensorboard());
  for (const auto& [text, tensorboard] :
       std::vector<std::pair<std::string, bool>>{{"report_to: [wandb, tensorboard]\n", true},
                                                 {"report_to: none\n", false},
                                                 {"report_to: wandb\n", false},
                                                 {"report_to: all\n", true},
                                                 {"report_to: \"tensorboard,mlflow\"\n", true}}) {
    CAPTURE(text);
    CHECK(kiln::train::pretrain_config_from_yaml_text("model: tiny\n" + text, "r.yaml").report_to_tensorboard() ==
          tensorboard);
  }
  CHECK_THAT(error_of([&] { kiln::train::pretrain_config_from_yaml_text("model: tiny\nreport_to: [x]\n", "r.yaml"); }),
             Contains("r.yaml") && Contains("report_to") && Contains("'x'"));
  CHECK(kiln::train::load_pretrain_config(
            "", {{"model", "tiny"}, {"report_to", "tensorboard"}, {"logging_dir", "tb"}, {"plot_loss", "true"}})
            .logging_dir == "tb");
  CHECK_THAT(
      error_of([&] { kiln::train::pretrain_config_from_yaml_text(yaml + "trust_remote_cod: true\n", "lf.yaml"); }),
      Contains("lf.yaml") && Contains("'trust_remote_cod'") && Contains("unknown key"));
  CHECK_THAT(error_of([&] { kiln::train::pretrain_config_from_yaml_text(yaml + "lora_rank: 16\n", "lf.yaml"); }),
             Contains("'lora_rank'") && Contains("finetuning_type: full"));
  // HF: eval_strategy steps without eval_steps evaluates every logging_steps.
  const auto d = kiln::train::pretrain_config_from_yaml_text(
      "model: tiny\nlogging_steps: 7\neval_strategy: steps\ndisable_gradient_checkpointing: true\n", "x");
  CHECK(d.eval_steps == 7);
  const std::string path = (kiln::test::scratch_dir("lf_eval") / "e.yaml").string();
  std::ofstream(path) << "model: tiny\neval_steps: 50\n";
  CHECK(kiln::train::load_pretrain_config(path, {{"eval_strategy", "steps"}}).eval_steps == 50);
  CHECK_FALSE(d.gradient_checkpointing);
}

namespace {
fs::path write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
  return p;
}
}  // namespace

TEST_CASE("dataset_info.json: files, folders, columns.prompt; hub entries and mistakes are clear errors", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("dataset_info");
  write(dir / "a.json", R"([{"text": "one"}])");
  write(dir / "b.jsonl", "{\"body\": \"two\"}\n");
  write(dir / "folder" / "y.txt", "y\n");
  write(dir / "folder" / "x.txt", "x\n");
  write(dir / "mixed" / "x.txt", "x\n");
  write(dir / "mixed" / "y.jsonl", "{}\n");
  write(dir / "c.parquet", "PAR1");
  write(dir / "c.csv", "text\nx\n");
  write(dir / "zst" / "b.jsonl.zst", "");
  write(dir / "zst" / "a.jsonl.zst", "");
  const std::string info = R"({
    "a": {"file_name": "a.json"},
    "b": {"file_name": "b.jsonl", "columns": {"prompt": "body"}},
    "f": {"file_name": "folder"},
    "mixed": {"file_name": "mixed"},
    "pq": {"file_name": "c.parquet"},
    "zf": {"file_name": "zst"},
    "csv": {"file_name": "c.csv"},
    "missing": {"file_name": "nope.jsonl"},
    "hf": {"hf_hub_url": "allenai/c4"},
    "ms": {"ms_hub_url": "x/y", "file_name": "a.json"},
    "om": {"om_hub_url": "x/y"},
    "script": {"script_url": "s"},
    "sft": {"file_name": "a.json", "formatting": "sharegpt"},
    "train_split": {"file_name": "a.json", "split": "train"},
    "sliced": {"file_name": "a.json", "split": "train[:10]"}
  })";
  const auto ds = kiln::data::parse_dataset_info(info, " a, b ,f", dir.string(), "info.json");
  REQUIRE(ds.size() == 3);
  CHECK(ds[0].name == "a");
  CHECK(ds[0].text_column == "text");
  CHECK(ds[1].text_column == "body");
  REQUIRE(ds[2].files.size() == 2);
  CHECK(fs::path(ds[2].files[0]).filename() == "x.txt");  // sorted
  auto err = [&](const std::string& names) {
    return error_of([&] { kiln::data::parse_dataset_info(info, names, dir.string(), "info.json"); });
  };
  for (const char* hub : {"hf", "ms", "om", "script"}) {
    CHECK_THAT(err(hub), Contains("info.json") && Contains(std::string("'") + hub + "'") && Contains("no network") &&
                             Contains("download"));
  }
  CHECK_THAT(err("zzz"), Contains("'zzz'") && Contains("not defined"));
  CHECK_THAT(err("missing"), Contains("nope.jsonl") && Contains("not found"));
  CHECK_THAT(err("mixed"), Contains("one type"));
  CHECK_THAT(err("csv"), Contains("c.csv") && Contains(".jsonl.zst") && Contains(".parquet"));
  // .parquet and .jsonl.zst files and folders resolve (their type by extension, as LLaMA-Factory's).
  const auto pq = kiln::data::parse_dataset_info(info, "pq,zf", dir.string(), "info.json");
  REQUIRE(pq.size() == 2);
  CHECK(fs::path(pq[0].files.at(0)).filename() == "c.parquet");
  REQUIRE(pq[1].files.size() == 2);
  CHECK(fs::path(pq[1].files[0]).filename() == "a.jsonl.zst");
  CHECK_THAT(err("sft"), Contains("sharegpt"));
  // datasets' split: the whole train split is what kiln reads; a slice would select other rows.
  CHECK(kiln::data::parse_dataset_info(info, "train_split", dir.string(), "info.json").size() == 1);
  CHECK_THAT(err("sliced"), Contains("'sliced'") && Contains("split \"train[:10]\"") && Contains("not supported"));
  CHECK_THAT(error_of([&] { kiln::data::parse_dataset_info("[1]", "a", dir.string(), "info.json"); }),
             Contains("info.json"));
}

TEST_CASE("named datasets: documents + EOS in order, max_samples per dataset, a cache keyed by content", "[data]") {
  const fs::path dir = kiln::test::scratch_dir("named_datasets");
  write(dir / "arr.json", R"([{"text": "alpha"}, {"text": "beta", "x": 1}, {"text": "gamma"}])");
  write(dir / "lines.json", "{\"text\": \"jl1\"}\n\n{\"text\": \"jl2\"}\n");  // JSON Lines in a .json
  write(dir / "b.jsonl", "{\"c\": \"delta\"}\n{\"c\": \"eps\"}\n");
  write(dir / "dataset_info.json",
        R"({"arr": {"file_name": "arr.json"}, "jl": {"file_name": "lines.json"},
            "b": {"file_name": "b.jsonl", "columns": {"prompt": "c"}}})");
  const kiln::data::ByteTokenizer tok;
  const auto datasets = kiln::data::resolve_datasets("arr,jl,b", dir.string());
  kiln::data::NamedDatasetOptions o;
  o.cache_dir = (dir / "cache").string();
  auto tokens_of = [&](const std::string& shard_dir) {
    const auto shards = kiln::data::TokenShards::open(shard_dir);
    const auto split = shards->split("train");
    std::vector<int64_t> ids(split->num_tokens());
    split->copy_tokens(0, split->num_tokens(), ids.data());
    return ids;
  };
  auto expected = [&](const std::vector<std::string>& docs) {
    std::vector<int64_t> ids;
    for (const auto& d : docs) {
      for (unsigned char ch : d) ids.push_back(ch);
      ids.push_back(tok.eos_id());
    }
    return ids;
  };
  const auto first = kiln::data::prepare_named_datasets(tok, datasets, o);
  CHECK(first.tokenized);
  CHECK(tokens_of(first.shard_dir) == expected({"alpha", "beta", "gamma", "jl1", "jl2", "delta", "eps"}));
  // Each dataset's documents (what a mixture interleaves), also when the cache is reused.
  CHECK(first.documents == std::vector<int64_t>{3, 2, 2});
  CHECK(first.names == std::vector<std::string>{"arr", "jl", "b"});
  CHECK(kiln::data::named_dataset_documents(first.shard_dir) == std::vector<int64_t>{3, 2, 2});
  const auto again = kiln::data::prepare_named_datasets(tok, datasets, o);
  CHECK_FALSE(again.tokenized);
  CHECK(again.shard_dir == first.shard_dir);
  CHECK(again.documents == first.documents);
  // Another token after each document (a template's): other shards, under another key.
  {
    auto sep = o;
    sep.separator_id = 7;
    const auto other = kiln::data::prepare_named_datasets(tok, datasets, sep);
    CHECK(other.key != first.key);
    auto ids = expected({"alpha", "beta", "gamma", "jl1", "jl2", "delta", "eps"});
    for (auto& id : ids) id = id == tok.eos_id() ? 7 : id;
    CHECK(tokens_of(other.shard_dir) == ids);
  }
  o.overwrite_cache = true;
  CHECK(kiln::data::prepare_named_datasets(tok, datasets, o).tokenized);
  o.overwrite_cache = false;
  o.max_samples = 2;
  const auto capped = kiln::data::prepare_named_datasets(tok, datasets, o);
  CHECK(capped.shard_dir != first.shard_dir);
  CHECK(tokens_of(capped.shard_dir) == expected({"alpha", "beta", "jl1", "jl2", "delta", "eps"}));
  // Changed content: a new key.
  o.max_samples = 0;
  write(dir / "b.jsonl", "{\"c\": \"delta\"}\n{\"c\": \"EPS\"}\n");
  const auto changed = kiln::data::prepare_named_datasets(tok, datasets, o);
  CHECK(changed.tokenized);
  CHECK(changed.key != first.key);
  // .jsonl.gz (zlib): the same documents as the plain file.
  {
    fs::create_directories(dir / "gz");
    gzFile gz = gzopen((dir / "gz" / "b.jsonl.gz").string().c_str(), "wb");
    REQUIRE(gz);
    const std::string text = "{\"c\": \"delta\"}\n{\"c\": \"EPS\"}\n";
    gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
    gzclose(gz);
    write(dir / "gz" / "dataset_info.json", R"({"b": {"file_name": "b.jsonl.gz", "columns": {"prompt": "c"}}})");
    const auto gz_set =
        kiln::data::prepare_named_datasets(tok, kiln::data::resolve_datasets("b", (dir / "gz").string()), o);
    CHECK(tokens_of(gz_set.shard_dir) == expected({"delta", "EPS"}));
  }
  // tokenized_path: reused as long as it holds these datasets.
  o.tokenized_path = (dir / "tok").string();
  CHECK(kiln::data::prepare_named_datasets(tok, datasets, o).tokenized);
  CHECK_FALSE(kiln::data::prepare_named_datasets(tok, datasets, o).tokenized);
  CHECK(fs::exists(dir / "tok" / "meta.json"));
}

TEST_CASE("val_size's split: a random subset of the blocks by seed, not the last ones", "[data]") {
  const auto [train, val] = kiln::data::random_split(100, 10, 42);
  CHECK(train.size() == 90);
  CHECK(val.size() == 10);
  CHECK(std::is_sorted(val.begin(), val.end()));
  std::set<int64_t> all(train.begin(), train.end());
  all.insert(val.begin(), val.end());
  CHECK(all.size() == 100);
  CHECK(val != std::vector<int64_t>{90, 91, 92, 93, 94, 95, 96, 97, 98, 99});
  CHECK(kiln::data::random_split(100, 10, 42).second == val);
  CHECK(kiln::data::random_split(100, 10, 43).second != val);
}

TEST_CASE("LLaMA-Factory data keys: val_size's type, packing, map batches, streaming's own rules", "[config][lf]") {
  using kiln::train::pretrain_config_from_yaml_text;
  const std::string base = "model: tiny\ndataset: a\n";
  // datasets reads the Python type YAML gives: an integer is a count of documents, even 1.
  const auto one = pretrain_config_from_yaml_text(base + "val_size: 1\n", "lf.yaml");
  CHECK(one.val_size == 1);
  CHECK(one.val_size_is_count);
  CHECK_FALSE(pretrain_config_from_yaml_text(base + "val_size: 0.1\n", "lf.yaml").val_size_is_count);
  CHECK(pretrain_config_from_yaml_text(base + "val_size: 200\n", "lf.yaml").val_size_is_count);
  CHECK_FALSE(pretrain_config_from_yaml_text(base + "val_size: 20.0\n", "lf.yaml").val_size_is_count);
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text(base + "val_size: 1.0\n", "lf.yaml"); }),
             Contains("lf.yaml") && Contains("val_size") && Contains("test_size=1.0"));
  // packing: left out = cutoff_len blocks; written true = cutoff_len - 1 (LLaMA-Factory's quirk).
  CHECK(pretrain_config_from_yaml_text(base + "cutoff_len: 64\n", "lf.yaml").block_len() == 64);
  CHECK(pretrain_config_from_yaml_text(base + "cutoff_len: 64\npacking: true\n", "lf.yaml").block_len() == 63);
  CHECK(pretrain_config_from_yaml_text(base + "cutoff_len: 64\npacking: True\n", "lf.yaml").packing == "true");
  CHECK(pretrain_config_from_yaml_text(base + "packing: false\n", "lf.yaml").packing == "false");
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text(base + "packing: maybe\n", "lf.yaml"); }),
             Contains("packing"));
  // A shard folder is always packed; packing: true there keeps cutoff_len.
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text("model: tiny\npacking: false\n", "k.yaml"); }),
             Contains("packing") && Contains("dataset"));
  CHECK(pretrain_config_from_yaml_text("model: tiny\ncutoff_len: 64\npacking: true\n", "k.yaml").block_len() == 64);
  const auto pb = pretrain_config_from_yaml_text(
      base + "preprocessing_batch_size: 64\npreprocessing_num_workers: 4\ndata_seed: 3\n", "lf.yaml");
  CHECK(pb.preprocessing_batch_size == 64);
  CHECK(pb.preprocessing_num_workers == 4);
  CHECK(pb.data_seed == 3);
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text(base + "preprocessing_batch_size: 0\n", "lf.yaml"); }),
             Contains("preprocessing_batch_size"));
  // streaming: LLaMA-Factory's three checks, in its words, then dataloader_num_workers 0 (the
  // empty stream LLaMA-Factory itself fails on), a shard folder, tokenized_path, eval_on_each_dataset.
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text(base + "streaming: true\nval_size: 0.1\n", "lf.yaml"); }),
             Contains("Streaming mode should have an integer val size."));
  CHECK_THAT(error_of([&] {
               pretrain_config_from_yaml_text(base + "streaming: true\nmax_samples: 5\nmax_steps: 9\n", "lf.yaml");
             }),
             Contains("`max_samples` is incompatible with `streaming`."));
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text(base + "streaming: true\n", "lf.yaml"); }),
             Contains("Please specify `max_steps` in streaming mode."));
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text(base + "streaming: true\nmax_steps: 9\n", "lf.yaml"); }),
             Contains("lf.yaml") && Contains("dataloader_num_workers") && Contains("0") &&
                 Contains("LLaMA-Factory 0.9.5") && Contains("itself fails") && Contains("StopIteration"));
  const std::string streamed = "streaming: true\nmax_steps: 9\ndataloader_num_workers: 2\n";
  const auto s = pretrain_config_from_yaml_text(base + streamed + "buffer_size: 64\nval_size: 5\n", "lf.yaml");
  CHECK(s.streaming);
  CHECK(s.dataloader_num_workers == 2);
  CHECK(s.buffer_size == 64);
  CHECK(pretrain_config_from_yaml_text(base + streamed + "val_size: 1.0\n", "lf.yaml").val_size == 1);  // take(1)
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text("model: tiny\n" + streamed, "k.yaml"); }),
             Contains("streaming") && Contains("dataset:"));
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text(base + streamed + "tokenized_path: t\n", "lf.yaml"); }),
             Contains("tokenized_path") && Contains("Turn off `streaming` when saving dataset to disk."));
  CHECK_THAT(error_of([&] {
               pretrain_config_from_yaml_text(base + streamed + "eval_dataset: b\neval_on_each_dataset: true\n",
                                              "lf.yaml");
             }),
             Contains("eval_on_each_dataset") && Contains("streaming"));
  CHECK_THAT(error_of([&] { pretrain_config_from_yaml_text(base + "dataloader_num_workers: -1\n", "lf.yaml"); }),
             Contains("dataloader_num_workers"));
}
