// plan_run: a run's settings, data, step arithmetic and predicted memory before anything is
// allocated (run_plan.h); its banner. The trainer's set-up (trainer_setup.cpp) starts from it.
#include "kiln/train/run_plan.h"

#include <cmath>
#include <filesystem>
#include <numeric>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include "kiln/common/device.h"
#include "kiln/common/format.h"
#include "kiln/common/logger.h"
#include "kiln/common/runtime_info.h"
#include "kiln/config/yaml.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/plan.h"
#include "kiln/data/lf_examples.h"
#include "kiln/data/mixture.h"
#include "kiln/data/named_datasets.h"
#include "kiln/data/shards.h"
#include "kiln/data/stream_dataset.h"
#include "kiln/dist/comm.h"
#include "kiln/model/hf.h"
#include "kiln/train/hf/checkpoint_layout.h"
#include "kiln/train/kernel_choices.h"
#include "kiln/train/recomputation.h"
#include "kiln/train/run_description.h"
#include "kiln/train/training_data.h"

namespace kiln::train {

namespace fs = std::filesystem;

void check_dtype_for_gpu(const PretrainConfig& config, const std::string& gpu_name, int major, int minor) {
  if (config.bf16 && major < 8) {
    throw config::ConfigError(config::config_message(
        config.source, "bf16",
        fmt::format("true, but {} (compute capability {}.{}) has no bf16 arithmetic (it needs 8.0, an A100 or "
                    "later): use fp16: true, which trains with a dynamic loss scaler as Hugging Face's fp16 runs do",
                    gpu_name, major, minor)));
  }
}

c10::Device run_device(const PretrainConfig& config, const dist::DistEnv& env) {
  // auto, cpu or cuda: the one resolver (common/device.h); the GPU is LOCAL_RANK's.
  c10::Device resolved(c10::kCPU);
  try {
    resolved = device::resolve(config.device);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(config::config_message(config.source, "device", e.what()));
  }
  if (!resolved.is_cuda()) return c10::Device(c10::kCPU);
  // Launched by torchrun or srun: one process per device, LOCAL_RANK picks it (docs/distributed.md).
  const int64_t devices = static_cast<int64_t>(torch::cuda::device_count());
  if (env.local_rank >= devices) {
    throw std::runtime_error(fmt::format("local rank {} ({}) has no GPU of its own: this node has {}", env.local_rank,
                                         env.launcher, devices));
  }
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  const GpuInfo gpu = gpu_info(device.index());
  check_dtype_for_gpu(config, gpu.name, gpu.major, gpu.minor);
  return device;
}

PlacedRun run_target(const PretrainConfig& config, const model::LlamaConfig& model, const RunEnvironment& env) {
  PlacedRun out;
  RunTarget& t = out.target;
  if (env.described) {
    try {
      device::check_spec(config.device);
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(config::config_message(config.source, "device", e.what()));
    }
    t.cuda = env.gpu || config.device == "cuda" || (config.device == "auto" && device::resolve("auto").is_cuda());
    if (t.cuda) t.hardware = env.gpu;
    t.data_parallel = env.dist.world_size > 1;
  } else {
    out.device = run_device(config, env.dist);
    t.cuda = out.device.is_cuda();
    if (t.cuda) {
      t.hardware = cost::hardware_for_device_name(device::name(out.device), device::device_memory_bytes(out.device));
    }
    // Under a launcher the step runs data-parallel (also in a job of one process).
    t.data_parallel = env.dist.distributed();
  }
  t.world_size = env.dist.world_size;
  if (config.cutoff_len > model.max_position_embeddings && env.dist.rank == 0) {
    logger()->warn(
        "warning: {}: cutoff_len {} is beyond the model's max_position_embeddings {} ({}); positions past it were "
        "not trained",
        config.source, config.cutoff_len, model.max_position_embeddings, model.source);
  }
  return out;
}

namespace {

// The model's config alone: the preset or model YAML, or model_name_or_path's config.json.
model::LlamaConfig model_config_of(const PretrainConfig& c) {
  if (c.model_name_or_path.empty()) return model::load_llama_config(c.model);
  return model::read_hf_config((fs::path(c.model_name_or_path) / kModelConfigFile).string()).config;
}

// auto_fit: the planner's recommendation for the run's cutoff_len and global batch, applied to
// `c`; returns the banner's line.
std::string apply_auto_fit(PretrainConfig& c, const model::LlamaConfig& model, const c10::Device& device,
                           const RunTarget& target) {
  cost::PlanConfig p;
  p.source = c.source;
  p.model_config = model;
  p.cutoff_lens = {c.cutoff_len};
  p.kernels = c.kernels;
  p.run = describe_run(c, model, target);
  const std::string& m = c.auto_fit_memory;
  try {
    if (m.empty()) {
      p.device_memory_bytes = device::device_memory_bytes(device);
    } else if (const auto spec = cost::hardware_spec(m)) {
      p.device_memory_bytes = spec->memory_bytes;
      p.device_name = spec->name;
    } else {
      p.device_memory_bytes = cost::parse_bytes(m, "auto_fit_memory");
    }
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(config::config_message(c.source, "auto_fit_memory", e.what()));
  }
  const int world = target.world_size;
  p.target_sequences = c.per_device_train_batch_size * c.gradient_accumulation_steps * world;
  const cost::PlanReport plan = cost::make_plan(p);
  const cost::PlanRow* best = plan.recommended(c.cutoff_len);
  if (!best) {
    throw config::ConfigError(config::config_message(
        c.source, "auto_fit",
        fmt::format("nothing fits {} GB at cutoff_len {}, not even micro-batch 1 with full recomputation",
                    p.device_memory_bytes / 1e9, c.cutoff_len)));
  }
  c.per_device_train_batch_size = best->micro_batch;
  c.gradient_accumulation_steps = best->gradient_accumulation_steps;
  const bool selective = best->policy == "selective";
  c.gradient_checkpointing = best->every > 0 || selective;
  const bool every_n = c.gradient_checkpointing && !selective && best->every > 1;
  c.gradient_checkpointing_policy = !c.gradient_checkpointing ? ""
                                    : selective               ? "selective"
                                    : every_n                 ? "every_n"
                                                              : "full";
  c.gradient_checkpointing_every = every_n ? best->every : 0;
  return fmt::format(
      "micro-batch {} x accumulation {} x {} rank{} = {} sequences (target {}), recomputation {}; predicted {:.2f} GB "
      "of {:.2f} GB",
      best->micro_batch, best->gradient_accumulation_steps, world, world == 1 ? "" : "s", best->global_sequences,
      p.target_sequences, best->policy, best->needed_bytes / 1e9, p.device_memory_bytes / 1e9);
}

// LLaMA-Factory 0.9.5's examples (data/lf_examples.h) of one shard folder of named datasets,
// `per_dataset` documents each, in order. `key` names the datasets' key in errors.
class LfExamples {
 public:
  LfExamples(const PretrainConfig& config, std::shared_ptr<const data::TokenSplit> documents,
             std::vector<int64_t> per_dataset, const char* key, std::string names)
      : c_(config),
        documents_(std::move(documents)),
        per_dataset_(std::move(per_dataset)),
        key_(key),
        names_(std::move(names)) {
    const int64_t recorded = std::accumulate(per_dataset_.begin(), per_dataset_.end(), int64_t{0});
    if (recorded != documents_->num_documents()) {
      fail(key_, fmt::format("the shards of {} hold {} documents, their kiln_dataset.json records {}; "
                             "overwrite_cache: true tokenizes them again",
                             names_, documents_->num_documents(), recorded));
    }
  }

  // The datasets merged by mix_strategy (data/mixture.h), as LLaMA-Factory's merge_dataset.
  std::vector<int64_t> merged() const {
    try {
      return data::mix_documents(per_dataset_, data::parse_mix_strategy(c_.mix_strategy), c_.interleave_probabilities(),
                                 static_cast<uint64_t>(c_.seed));
    } catch (const std::invalid_argument& e) {
      fail("mix_strategy",
           fmt::format("{} ({}: {} documents per dataset)", e.what(), names_, fmt::join(per_dataset_, ", ")));
    }
  }

  // Dataset i's documents alone (eval_on_each_dataset: _get_merged_dataset(return_dict=True)).
  std::vector<int64_t> dataset(size_t i) const {
    const int64_t first =
        std::accumulate(per_dataset_.begin(), per_dataset_.begin() + static_cast<long>(i), int64_t{0});
    std::vector<int64_t> out(static_cast<size_t>(per_dataset_[i]));
    std::iota(out.begin(), out.end(), first);
    return out;
  }

  // The merged documents split into train and eval before packing (val_size).
  data::DocumentSplit split(std::vector<int64_t> merged) const {
    data::DocumentSplit split;
    try {
      split = data::split_documents(static_cast<int64_t>(merged.size()), c_.val_size, c_.val_size_is_count,
                                    static_cast<uint64_t>(c_.seed));
    } catch (const std::invalid_argument& e) {
      fail("val_size", fmt::format("{} ({} documents in {})", e.what(), merged.size(), names_));
    }
    // Positions in the merged order -> documents of the stream.
    for (auto* part : {&split.train, &split.eval}) {
      for (int64_t& position : *part) position = merged[static_cast<size_t>(position)];
    }
    return split;
  }

  // streaming: the stream of `part` (data/stream_dataset.h) in batches of `batch_size`, checked
  // as LLaMA-Factory's main process reads it first (loader.py:246, :263-271): a document, then a
  // packed example.
  std::shared_ptr<const data::StreamSpec> stream(data::StreamPart part, int64_t batch_size, data::LoaderOptions batches,
                                                 const std::string& what) const {
    auto spec = std::make_shared<data::StreamSpec>();
    spec->documents = documents_;
    data::StreamOrderOptions& o = spec->order;
    o.lengths = per_dataset_;
    o.num_shards = c_.dataloader_num_workers;
    o.strategy = data::parse_mix_strategy(c_.mix_strategy);
    o.probabilities = c_.interleave_probabilities();
    o.seed = static_cast<uint64_t>(c_.seed);
    o.buffer_size = c_.buffer_size;
    o.part = part;
    o.val_size = part == data::StreamPart::kAll ? 0 : static_cast<int64_t>(c_.val_size);
    spec->pack = {.block_len = c_.block_len(),
                  .packing = c_.packing != "false",
                  .batch_documents = c_.preprocessing_batch_size,
                  .workers = 1};
    batches.batch_size = batch_size;
    spec->batches = batches;
    try {
      // Every worker's order at epoch 0: datasets' and LLaMA-Factory's refusals (a shard per
      // worker of every dataset, the probabilities) before anything is read.
      for (int64_t w = 0; w < o.num_shards; ++w) {
        data::StreamOrderOptions ow = o;
        ow.num_workers = o.num_shards;
        ow.worker = w;
        data::StreamOrder check(ow);
      }
      data::StreamOrderOptions main = o;  // the main process: every shard, num_workers 0
      if (data::StreamOrder(main).next() < 0) {
        fail(part == data::StreamPart::kTrain ? "val_size" : key_,
             fmt::format("the {} stream of {} has no document{} (LLaMA-Factory fails there: StopIteration)", what,
                         names_,
                         part == data::StreamPart::kTrain ? fmt::format(": val_size {} takes all of the {} documents",
                                                                        o.val_size, documents_->num_documents())
                                                          : ""));
      }
      if (!data::StreamExamples(documents_, main, spec->pack).next()) {
        fail("cutoff_len",
             fmt::format("Cannot find sufficient samples, consider increasing dataset size. (LLaMA-Factory's words: "
                         "the {} stream of {} packs into no block of {} tokens within one preprocessing_batch_size "
                         "batch of {})",
                         what, names_, spec->pack.block_len, spec->pack.batch_documents));
      }
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      fail(m.find("shard") != std::string::npos ? "dataloader_num_workers" : "mix_strategy",
           fmt::format("{} ({}: {} documents per dataset; streaming: true shards each dataset into "
                       "dataloader_num_workers {} parts)",
                       m, names_, fmt::join(per_dataset_, ", "), o.num_shards));
    }
    return spec;
  }

  // `docs` packed per preprocessing_batch_size documents (or truncated one by one).
  std::shared_ptr<const data::PackedDataset> pack(std::vector<int64_t> docs, const std::string& what) const {
    const data::PackOptions po{.block_len = c_.block_len(),
                               .packing = c_.packing != "false",
                               .batch_documents = c_.preprocessing_batch_size,
                               .workers = c_.preprocessing_num_workers};
    const int64_t n = static_cast<int64_t>(docs.size());
    auto table = data::ExampleTable::build(std::move(docs), documents_->document_starts(), po);
    if (table->num_examples() == 0) {
      fail("cutoff_len",
           fmt::format("Cannot find sufficient samples, consider increasing dataset size. (LLaMA-Factory's words: the "
                       "{} {} documents pack into no block of {} tokens within one preprocessing_batch_size "
                       "batch of {})",
                       n, what, po.block_len, po.batch_documents));
    }
    return std::make_shared<data::PackedDataset>(documents_, table);
  }

 private:
  [[noreturn]] void fail(const char* key, const std::string& problem) const {
    throw config::ConfigError(config::config_message(c_.source, key, problem));
  }
  const PretrainConfig& c_;
  std::shared_ptr<const data::TokenSplit> documents_;
  std::vector<int64_t> per_dataset_;
  const char* key_;
  std::string names_;
};

// kiln's shard folders: the train split packed into cutoff_len blocks in order; val_size holds
// out random blocks, else the folder's val split is the evaluation data.
std::pair<std::shared_ptr<const data::PackedDataset>, std::shared_ptr<const data::PackedDataset>> packed_blocks(
    const PretrainConfig& config_, const data::TokenShards& shards,
    const std::shared_ptr<const data::TokenSplit>& train_split) {
  const int64_t blocks = train_split->num_tokens() / config_.cutoff_len;
  std::shared_ptr<const data::PackedDataset> train_set_, val_set_;
  // Evaluation data: val_size > 0 holds out blocks of the train split chosen at random by the
  // run's seed (a fraction, or a count; as LLaMA-Factory's split of its packed examples);
  // otherwise the shard set's own val split, when it has one block or more.
  int64_t held_out = 0;
  if (config_.val_size > 0) {
    held_out = config_.val_size < 1 ? static_cast<int64_t>(std::ceil(config_.val_size * static_cast<double>(blocks)))
                                    : static_cast<int64_t>(config_.val_size);
    if (held_out >= blocks) {
      throw config::ConfigError(config::config_message(
          config_.source, "val_size",
          fmt::format("holds out {} of the {} blocks of cutoff_len {}; nothing is left to train on", held_out, blocks,
                      config_.cutoff_len)));
    }
    const auto [train_blocks, val_blocks] = data::random_split(blocks, held_out, static_cast<uint64_t>(config_.seed));
    val_set_ = std::make_shared<data::PackedDataset>(train_split, config_.cutoff_len, val_blocks);
    train_set_ = std::make_shared<data::PackedDataset>(train_split, config_.cutoff_len, train_blocks);
  } else if (shards.has_split("val")) {
    const auto val_split = shards.split("val");
    if (val_split->num_tokens() >= config_.cutoff_len) {
      val_set_ = std::make_shared<data::PackedDataset>(val_split, config_.cutoff_len);
    }
  }
  if (!train_set_) train_set_ = std::make_shared<data::PackedDataset>(train_split, config_.cutoff_len);
  return {train_set_, val_set_};
}

// The data in the shard folder `dir`: packed blocks of its train split (its val split or blocks
// held out by val_size for evaluation), or LLaMA-Factory's examples; the train loader's options.
RunData plan_data(const PretrainConfig& config_, const model::LlamaConfig& model, const dist::DistEnv& env,
                  std::string dir) {
  RunData d;
  d.dir = std::move(dir);
  d.shards = data::TokenShards::open(d.dir);
  const auto& meta = d.shards->meta();
  d.shards->check_ids_below(model.vocab_size, fmt::format("the model's vocab_size ({})", model.source));
  if (meta.vocab_size > model.vocab_size) {
    throw config::ConfigError(
        config::config_message(config_.source, "dataset_dir",
                               fmt::format("{}: tokenizer vocabulary {} is larger than the model's vocab_size {} ({})",
                                           d.dir, meta.vocab_size, model.vocab_size, model.source)));
  }
  const auto train_split = d.shards->split("train");
  data::LoaderOptions& lo = d.loader;
  lo.batch_size = config_.per_device_train_batch_size;
  // The sampler's seed is HF Trainer's: data_seed, else seed (for shard folders too; the held-out
  // split keeps seed, as LLaMA-Factory's train_test_split does).
  lo.seed = static_cast<uint64_t>(config_.data_seed >= 0 ? config_.data_seed : config_.seed);
  lo.segment_ids = config_.neat_packing;
  lo.rank = env.rank;
  lo.world_size = env.world_size;
  if (config_.llamafactory_data()) {
    const LfSpecialTokens special = llamafactory_special_tokens(config_);
    if (env.rank == 0) {
      for (const auto& line : special.lines) logger()->info("kiln-pretrain: {}", line);
    }
    d.ignored_label_id = special.pad_id;
    // HF Trainer's sampler (torch.randperm) and transformers' collator with pad = EOS.
    lo.order = data::LoaderOptions::Order::kTorchRandperm;
    lo.ignore_label_id = lo.pad_id = d.ignored_label_id;
    const LfExamples train(config_, train_split, data::named_dataset_documents(d.dir), "dataset", config_.dataset);
    // eval_dataset's folder (training_shard_dir prepared it), opened once, whichever path reads it.
    std::vector<std::string> eval_names;
    const auto open_eval_datasets = [&] {
      const auto prepared = eval_datasets(config_);
      d.eval_shards = data::TokenShards::open(prepared.shard_dir);
      d.eval_shards->check_ids_below(model.vocab_size, fmt::format("the model's vocab_size ({})", model.source));
      eval_names = prepared.names;
      return LfExamples(config_, d.eval_shards->split("train"), prepared.documents, "eval_dataset",
                        config_.eval_dataset);
    };
    if (config_.streaming) {
      // get_dataset with streaming: the merged stream shuffled, then take/skip(val_size); each
      // split packed as it is read, by each DataLoader worker (data/stream_dataset.h).
      const bool held_out = config_.val_size > 1e-6;
      d.train_stream = train.stream(held_out ? data::StreamPart::kTrain : data::StreamPart::kAll,
                                    config_.per_device_train_batch_size, lo, "train");
      if (held_out) {
        d.eval_stream = train.stream(data::StreamPart::kEval, config_.per_device_eval_batch_size, lo, "eval");
      }
      if (!config_.eval_dataset.empty()) {
        const LfExamples eval = open_eval_datasets();
        // split_dataset: eval_dataset.shuffle(buffer_size, seed), all of it (data_utils.py:124-127).
        d.eval_stream = eval.stream(data::StreamPart::kAll, config_.per_device_eval_batch_size, lo,
                                    fmt::format("eval_dataset {}", config_.eval_dataset));
      }
      return d;
    }
    // get_dataset: merge (mix_strategy), split (val_size), pack each split.
    data::DocumentSplit split = train.split(train.merged());
    d.train = train.pack(std::move(split.train), "train");
    if (!split.eval.empty()) d.val = train.pack(std::move(split.eval), "eval");
    if (!config_.eval_dataset.empty()) {
      const LfExamples eval = open_eval_datasets();
      if (config_.eval_on_each_dataset) {
        for (size_t i = 0; i < eval_names.size(); ++i) {
          d.named_evals.emplace_back(eval_names[i],
                                     eval.pack(eval.dataset(i), fmt::format("eval_dataset {}", eval_names[i])));
        }
      } else {
        d.val = eval.pack(eval.merged(), fmt::format("eval_dataset {}", config_.eval_dataset));
      }
    }
  } else {
    const int64_t blocks = train_split->num_tokens() / config_.cutoff_len;
    if (blocks == 0) {
      throw config::ConfigError(
          config::config_message(config_.source, "cutoff_len",
                                 fmt::format("{} is longer than the whole train split of {} ({} tokens)",
                                             config_.cutoff_len, d.dir, train_split->num_tokens())));
    }
    std::tie(d.train, d.val) = packed_blocks(config_, *d.shards, train_split);
  }
  return d;
}

}  // namespace

namespace {

// The banner's words for a LLaMA-Factory run's evaluation data.
std::string eval_data_text(const RunData& d, const PretrainConfig& c) {
  if (!d.named_evals.empty()) {
    std::vector<std::string> each;
    for (const auto& [name, set] : d.named_evals)
      each.push_back(fmt::format("{} {}", name, with_commas(set->num_blocks())));
    return fmt::format("eval_on_each_dataset: {} examples", fmt::join(each, ", "));
  }
  if (!d.val) return "no eval split";
  if (d.eval_shards)
    return fmt::format("eval {} examples of eval_dataset {}", with_commas(d.val->num_blocks()), c.eval_dataset);
  return fmt::format("eval {} examples of held-out documents", with_commas(d.val->num_blocks()));
}

}  // namespace

std::vector<EvalSet> RunData::eval_sets() const {
  std::vector<EvalSet> out;
  if (val) out.push_back({"eval", val, nullptr});
  if (eval_stream) out.push_back({"eval", nullptr, eval_stream});
  for (const auto& [name, set] : named_evals) out.push_back({"eval_" + name, set, nullptr});
  return out;
}

RunPlan plan_run(const PretrainConfig& config, const PlanOptions& options) {
  RunPlan plan;
  PretrainConfig& c = plan.config;
  c = config;
  c.validate();
  plan.host_batches = options.host_batches;
  if (plan.host_batches && c.max_steps <= 0) {
    throw config::ConfigError(config::config_message(
        c.source, "max_steps", "must be > 0 when the host supplies the batches (there is no epoch to count)"));
  }
  plan.env = dist::read_dist_env();
  const bool main = plan.env.rank == 0;
  if (c.streaming && plan.env.world_size > 1) {
    // Before any data is prepared.
    throw config::ConfigError(config::config_message(
        c.source, "streaming",
        fmt::format("true with {} processes ({}) is not supported: accelerate dispatches an iterable dataset's "
                    "batches from rank 0 to the others (DataLoaderDispatcher), which kiln does not reproduce. "
                    "Stream in one process, or leave streaming out (the same documents are then split and "
                    "packed as LLaMA-Factory's non-streaming run does)",
                    plan.env.world_size, plan.env.launcher)));
  }
  if (c.full_determinism) {
    if (const std::string k = trainer_kernels(c.kernels, true); k != c.kernels) {
      if (main) {
        logger()->info(
            "kiln-pretrain: full_determinism: kernels {} instead of the default {}: kiln's flash-attention kernels "
            "have a deterministic backward, SDPA's fused ones do not under warn-only determinism",
            k, c.kernels);
      }
      c.kernels = k;
    }
  }
  if (c.resolved_zero_stage() > 0 && plan.env.world_size == 1 && main) {
    logger()->warn(
        "kiln-pretrain: warning: ZeRO stage {} has no effect in a single process (it shards across the "
        "ranks of torchrun or srun; docs/distributed.md)",
        c.resolved_zero_stage());
  }
  plan.model = model_config_of(c);
  const PlacedRun placed = run_target(c, plan.model, {.dist = plan.env});
  plan.device = placed.device;
  const RunTarget& target = placed.target;
  if (c.auto_fit) plan.auto_fit = apply_auto_fit(c, plan.model, plan.device, target);

  const int world = plan.env.world_size;
  if (plan.host_batches) {
    // The host's batches: as many examples as max_steps consumes (for the banner's arithmetic).
    plan.steps = plan_steps(c.max_steps * c.gradient_accumulation_steps * c.per_device_train_batch_size * world,
                            c.per_device_train_batch_size, world, c.gradient_accumulation_steps, c.num_train_epochs,
                            c.max_steps);
  } else {
    std::string dir = options.prepare_data ? options.prepare_data() : training_shard_dir(c, main);
    plan.data = plan_data(c, plan.model, plan.env, std::move(dir));
    plan.steps =
        plan.data.train_stream
            ? plan_stream_steps(c.per_device_train_batch_size, world, c.gradient_accumulation_steps, c.max_steps)
            : plan_steps(plan.data.train->num_blocks(), c.per_device_train_batch_size, world,
                         c.gradient_accumulation_steps, c.num_train_epochs, c.max_steps);
  }
  plan.run = describe_run(c, plan.model, target);
  plan.memory = cost::estimate_training_memory(plan.model, plan.run);
  return plan;
}

std::string run_banner(const RunPlan& plan, const dist::Comm* comm) {
  const PretrainConfig& c = plan.config;
  const RunData& d = plan.data;
  const int zero_stage = c.resolved_zero_stage();
  std::string out = training_banner(plan.steps, plan.model.num_parameters());
  out += fmt::format("\n  Device = {}, compute dtype = {}, kernels = {}", plan.device.str(),
                     c.bf16   ? "bf16 (autocast)"
                     : c.fp16 ? "fp16 (autocast, loss scaling)"
                              : "fp32",
                     c.kernels);
  if (c.gradient_checkpointing) {
    const Recomputation r =
        resolve_recomputation(true, c.gradient_checkpointing_policy, c.gradient_checkpointing_every);
    const bool lf_default =
        (c.llamafactory_data() || c.disable_gradient_checkpointing >= 0) && c.disable_gradient_checkpointing != 1;
    out += fmt::format("\n  Recomputation = {}{}", r.name(),
                       lf_default ? " (gradient checkpointing: LLaMA-Factory's default unless "
                                    "disable_gradient_checkpointing: true)"
                                  : "");
  }
  const bool planned_job = comm == nullptr && plan.env.launcher != "none";
  if (comm) {
    out += fmt::format("\n  Distributed = {} processes ({}, {}; this is rank {}), ZeRO stage {}, buckets of {} MB",
                       comm->world_size(), comm->env().launcher, comm->backend(), comm->rank(), zero_stage,
                       c.ddp_bucket_cap_mb);
  } else if (planned_job) {
    out += fmt::format(
        "\n  Distributed = {} processes ({}; planned, not joined; this is rank {}), ZeRO stage {}, "
        "buckets of {} MB",
        plan.env.world_size, plan.env.launcher, plan.env.rank, zero_stage, c.ddp_bucket_cap_mb);
  }
  const bool per_rank = comm != nullptr || planned_job;
  if (plan.host_batches) {
    out += "\n  Data = batches supplied by the host program";
  } else if (d.train_stream) {
    const auto docs = d.shards->split("train");
    const data::StreamSpec& t = *d.train_stream;
    out += fmt::format(
        "\n  Data = {} ({} documents of {}, {} tokens), streamed as LLaMA-Factory's streaming: true: "
        "dataloader_num_workers {} (one shard each), shuffle buffer {}, seed {}; {} of {} tokens per map batch of {} "
        "documents; {}",
        d.dir, with_commas(docs->num_documents()), c.dataset, with_commas(docs->num_tokens()), t.order.num_shards,
        with_commas(t.order.buffer_size), c.seed, t.pack.packing ? "blocks" : "documents truncated", t.pack.block_len,
        with_commas(t.pack.batch_documents),
        !d.eval_stream           ? "no eval split"
        : c.eval_dataset.empty() ? fmt::format("eval = the stream's first {} documents (take), train = the rest (skip)",
                                               static_cast<int64_t>(c.val_size))
                                 : fmt::format("eval = eval_dataset {}, streamed alike", c.eval_dataset));
    if (c.mix_strategy != "concat") {
      out += fmt::format(
          "\n  Mixture = {}{} (datasets' iterable interleave_datasets, seed {})", c.mix_strategy,
          c.interleave_probs.empty() ? " round robin" : fmt::format(", probabilities {}", c.interleave_probs), c.seed);
    }
  } else if (c.llamafactory_data()) {
    const auto docs = d.shards->split("train");
    out += fmt::format(
        "\n  Data = {} ({} documents of {}, {} tokens; train {} examples of {}{} tokens, {} tokens dropped; {})", d.dir,
        with_commas(docs->num_documents()), c.dataset, with_commas(docs->num_tokens()),
        with_commas(d.train->num_blocks()), d.train->fixed_length() ? "" : "up to ", d.train->cutoff_len(),
        with_commas(d.train->dropped_tokens()), eval_data_text(d, c));
    if (c.mix_strategy != "concat") {
      out += fmt::format(
          "\n  Mixture = {}{} (datasets' interleave_datasets, seed {})", c.mix_strategy,
          c.interleave_probs.empty() ? " round robin" : fmt::format(", probabilities {}", c.interleave_probs), c.seed);
    }
  } else {
    out += fmt::format("\n  Data = {} ({} train tokens in {} blocks of {}, {} dropped; {})", d.dir,
                       with_commas(d.shards->split("train")->num_tokens()), with_commas(d.train->num_blocks()),
                       c.cutoff_len, with_commas(d.train->dropped_tokens()),
                       d.val ? fmt::format("val {} blocks{}", with_commas(d.val->num_blocks()),
                                           c.val_size > 0 ? " held out by val_size" : "")
                             : "no val split");
  }
  out += fmt::format("\n  Predicted peak memory{} = {} (at the {}:", per_rank ? " per rank" : "",
                     human_bytes(plan.memory.total()), plan.memory.peak_phase);
  for (const auto& [name, bytes] : plan.memory.components) {
    if (bytes > 0) out += fmt::format(" {} {};", name, human_bytes(bytes));
  }
  out.back() = ')';
  if (!plan.auto_fit.empty()) out += "\n  Auto-fit = " + plan.auto_fit;
  return out;
}

}  // namespace kiln::train
