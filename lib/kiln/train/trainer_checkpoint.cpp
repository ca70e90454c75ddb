// Checkpoints: save (model, optimizer shards, loader and random states, HF's trainer_state.json)
// and resume exactly, with HF's fractional epoch and trainer state.
#include <regex>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/common/logger.h"
#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/io/safetensors.h"
#include "kiln/model/hf.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/grad.h"
#include "kiln/train/checkpoint_dir.h"
#include "kiln/train/run_outputs.h"
#include "kiln/train/trainer_internal.h"
#include "kiln/train/training_data.h"

namespace kiln::train {

// HF's state.epoch: the batches consumed so far over the batches per epoch. An epoch's last
// window may be shorter than gradient_accumulation_steps (step_math.h).
double Trainer::epoch_of(int64_t step) const {
  const int64_t per_epoch = std::max<int64_t>(plan_.updates_per_epoch, 1);
  const int64_t batches = std::max<int64_t>(plan_.batches_per_epoch, 1);
  const int64_t consumed =
      (step / per_epoch) * batches + std::min(step % per_epoch * config_.gradient_accumulation_steps, batches);
  return static_cast<double>(consumed) / static_cast<double>(batches);
}

HfTrainerState Trainer::hf_trainer_state(int64_t step) const {
  HfTrainerState s;
  s.global_step = step;
  s.epoch = epoch_of(step);
  s.max_steps = plan_.total_steps;
  s.logging_steps = config_.logging_steps;
  s.eval_steps = config_.eval_steps > 0 ? config_.eval_steps : config_.logging_steps;
  s.save_steps = config_.save_steps;
  s.train_batch_size = config_.per_device_train_batch_size;
  const int64_t per_epoch = std::max<int64_t>(plan_.updates_per_epoch, 1);
  s.num_train_epochs = (plan_.total_steps + per_epoch - 1) / per_epoch;
  s.total_flos = state_->total_flos;
  s.log_history = state_->log_history;
  return s;
}

const ModelFolderFiles& Trainer::State::folder_files(const PretrainConfig& config, const model::LlamaConfig& mc) {
  if (model_files) return *model_files;
  // The tokenizer the training data was made with (shards record it); the model's own when the
  // host supplies the batches, or when the shards were tokenized where their path no longer leads.
  std::string tokenizer = model_tokenizer_spec(config);
  int64_t bos = mc.bos_token_id, eos = mc.eos_token_id;
  if (shards) {
    const auto& meta = shards->meta();
    bos = meta.bos_id;
    eos = meta.eos_id;
    if (meta.tokenizer == "byte" || fs::is_regular_file(meta.tokenizer)) tokenizer = meta.tokenizer;
  }
  model_files = std::make_shared<const ModelFolderFiles>(
      model_folder_files(tokenizer, bos, eos, config.model_name_or_path, mc.bos_token_id, mc.eos_token_id));
  return *model_files;
}

model::SaveOptions save_options_for(const ModelFolderFiles& files) {
  model::SaveOptions o;
  o.bos_token_id = files.bos_token_id;
  o.eos_token_id = files.eos_token_id;
  if (files.pad_token_id >= 0) o.pad_token_id = files.pad_token_id;
  return o;
}

namespace {

// Per-rank files of a data-parallel checkpoint: AdamW shards (ZeRO 1, 2) and random states (as HF's
// rng_state_{rank}).
std::string optimizer_shard_file(int rank, int world) {
  return fmt::format("optimizer.rank-{:05d}-of-{:05d}.safetensors", rank, world);
}
std::string rng_state_file(int rank, int world) {
  return world > 1 ? fmt::format("rng_state_{}.safetensors", rank) : "rng_state.safetensors";
}
// What a resume must match that HF's trainer_state.json has no field for.
constexpr const char* kKilnStateFile = "kiln_state.json";

}  // namespace

std::string Trainer::save_checkpoint(int64_t step) {
  // Data parallel: rank 0 prepares the folder; every rank writes its part into it; once all have
  // (a barrier), rank 0 renames it into place, so a checkpoint-N folder is whole or absent.
  State& st = *state_;
  const fs::path final_dir = fs::path(config_.output_dir) / fmt::format("checkpoint-{}", step);
  if (st.last_saved_step == step && fs::is_directory(final_dir)) return final_dir.string();
  const fs::path tmp = fs::path(config_.output_dir) / fmt::format(".checkpoint-{}.tmp", step);
  if (is_main()) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  if (comm_) comm_->barrier();
  const bool sharded = dp_ && zero_stage_ > 0;
  if (is_main() || sharded) {
    io::NamedTensors opt;
    for (const auto& [name, t] : optimizer_->state_dict()) opt.emplace_back(name, t);
    if (scaler_) {
      opt.emplace_back("grad_scaler.scale", scaler_->scale());
      opt.emplace_back("grad_scaler.growth_tracker", scaler_->growth_tracker());
    }
    const std::string file = sharded ? optimizer_shard_file(rank(), world_size()) : "optimizer.safetensors";
    io::save_safetensors((tmp / file).string(), opt);
  }
  const at::Tensor cpu_rng = cpu_rng_state();
  io::save_safetensors((tmp / rng_state_file(rank(), world_size())).string(), {{"cpu", cpu_rng}});
  if (is_main()) {
    // The model folder as LLaMA-Factory's checkpoints hold it: the tokenizer files, chat template,
    // generation config and the run's arguments (training_args.json for HF's pickled .bin).
    const ModelFolderFiles& files = st.folder_files(config_, model_->config());
    model::save_pretrained(model_, tmp.string(), save_options_for(files));
    write_model_folder_files(files, tmp.string());
    io::write_file_atomic((tmp / "training_args.json").string(), pretrain_config_json(config_));
    if (loader_) {  // a host's batches have no position kiln could restore
      io::write_file_atomic((tmp / "loader_state.json").string(), loader_->state().to_json());
      io::write_file_atomic((tmp / data::DataRecord::kFile).string(),
                            data::DataRecord::of(state_->data_dir, state_->shards->meta()).to_json());
    }
    // HF's trainer_state.json (TrainerState.load_from_json reads it); kiln's own facts beside it.
    io::write_file_atomic((tmp / "trainer_state.json").string(), trainer_state_text(hf_trainer_state(step)));
    const json kiln_state = {{"world_size", world_size()}, {"zero_stage", dp_ ? zero_stage_ : 0}};
    io::write_file_atomic((tmp / kKilnStateFile).string(), kiln_state.dump(2) + "\n");
  }
  if (comm_) comm_->barrier();  // every rank's part is on disk
  if (is_main()) {
    replace_folder_atomically(tmp, final_dir);
    rotate_checkpoints(config_.output_dir, config_.save_total_limit, {final_dir, fs::path(st.resumed_from)});
  }
  if (comm_) comm_->barrier();
  st.last_saved_step = step;
  if (callbacks_.on_save) callbacks_.on_save(step, final_dir.string());
  return final_dir.string();
}

void Trainer::resume(const std::string& dir) {
  const fs::path d(dir);
  state_->resumed_from = dir;
  for (const char* f : {"config.json", "loader_state.json", "trainer_state.json"}) {
    if (source_ && std::string(f) == "loader_state.json") continue;  // the host restores its own data
    if (!fs::exists(d / f)) {
      throw std::runtime_error(fmt::format("resume_from_checkpoint: {} is not a kiln checkpoint (no {})", dir, f));
    }
  }
  json ts;
  const char* key = "";
  try {
    ts = json::parse(read_text(d / "trainer_state.json"));
    key = "global_step";
    state_->global_step = ts.at(key).get<int64_t>();
    if (state_->global_step < 0) throw std::invalid_argument(fmt::format("must be >= 0, got {}", state_->global_step));
    key = "log_history";
    if (!ts.at(key).is_array()) throw std::invalid_argument("must be an array");
    state_->log_history = ts.at(key);
    key = "total_flos";
    state_->total_flos = ts.value(key, 0.0);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: invalid trainer state{}: {}", (d / "trainer_state.json").string(),
                                         *key ? fmt::format(" (field {})", key) : "", e.what()));
  }
  // kiln_state.json; checkpoints of kiln 0.2 kept these keys in trainer_state.json.
  fs::path state_file = d / "trainer_state.json";
  if (fs::exists(d / kKilnStateFile)) {
    state_file = d / kKilnStateFile;
    try {
      ts = json::parse(read_text(state_file));
    } catch (const json::exception& e) {
      throw std::runtime_error(fmt::format("{}: invalid JSON: {}", state_file.string(), e.what()));
    }
  }
  // The data order and the optimizer shards depend on the world size: resume on the same one.
  const auto field = [&](const char* key, int64_t fallback, int64_t lo, int64_t hi) {
    const auto it = ts.find(key);
    if (it == ts.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi) {
      throw std::runtime_error(
          fmt::format("{}: {} must be an integer in [{}, {}], got {}", state_file.string(), key, lo, hi, it->dump()));
    }
    return it->get<int64_t>();
  };
  if (!ts.is_object()) throw std::runtime_error(fmt::format("{}: expected a JSON object", state_file.string()));
  const int64_t saved_world = field("world_size", 1, 1, int64_t{1} << 20);
  const int64_t saved_stage = field("zero_stage", 0, 0, 2);
  const int64_t stage = dp_ ? zero_stage_ : 0;
  if (saved_world != world_size() || (saved_stage != stage && (saved_stage > 0 || stage > 0))) {
    throw std::runtime_error(
        fmt::format("resume_from_checkpoint: {} was written by {} process{} with zero_stage {} ({}); this run has {} "
                    "with zero_stage {}. Resume with the same world size and stage (docs/distributed.md)",
                    dir, saved_world, saved_world == 1 ? "" : "es", saved_stage, state_file.filename().string(),
                    world_size(), stage));
  }
  const bool sharded = stage > 0;
  const std::string opt_file = sharded ? optimizer_shard_file(rank(), world_size()) : "optimizer.safetensors";
  if (!fs::exists(d / opt_file)) {
    throw std::runtime_error(fmt::format("resume_from_checkpoint: {} is not a kiln checkpoint (no {})", dir, opt_file));
  }
  io::SafetensorsCheckpoint weights(dir);
  model::load_weights(*model_, weights, dir);

  io::SafetensorsFile opt((d / opt_file).string());
  std::map<std::string, at::Tensor> state;
  for (const auto& name : opt.names()) state[name] = opt.tensor(name);
  try {
    optimizer_->load_state_dict(state);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: {}", opt.path(), e.what()));
  }
  if (scaler_ && opt.contains("grad_scaler.scale")) {
    const at::Tensor scale = opt.tensor("grad_scaler.scale"), tracker = opt.tensor("grad_scaler.growth_tracker");
    const auto one_number = [](const at::Tensor& t) { return t.numel() == 1 && !at::isComplexType(t.scalar_type()); };
    if (!one_number(scale) || !std::isfinite(scale.item<double>()) || scale.item<double>() <= 0 ||
        !one_number(tracker) || tracker.item<double>() < 0) {
      throw std::runtime_error(
          fmt::format("{}: grad_scaler.scale must be one finite number > 0 and "
                      "grad_scaler.growth_tracker one number >= 0",
                      opt.path()));
    }
    scaler_->mutable_scale().copy_(scale.reshape(scaler_->scale().sizes()));
    scaler_->growth_tracker().copy_(tracker.reshape(scaler_->growth_tracker().sizes()));
  }
  if (const fs::path rng_file = d / rng_state_file(rank(), world_size()); fs::exists(rng_file)) {
    io::SafetensorsFile rng(rng_file.string());
    try {
      set_cpu_rng_state(rng.tensor("cpu").clone());
    } catch (const c10::Error& e) {
      throw std::runtime_error(fmt::format("{}: tensor 'cpu' is not a CPU generator's state ({})", rng_file.string(),
                                           e.what_without_backtrace()));
    }
  }
  if (loader_ && state_->shards) {
    // The checkpoint's data position applies to the data it was written for: the same tokenizer
    // (a position in other tokens would silently train on a different stream).
    if (const auto record = data::DataRecord::read(dir)) {
      const auto& meta = state_->shards->meta();
      if (record->tokenizer_fingerprint != meta.tokenizer_fingerprint || record->vocab_size != meta.vocab_size) {
        throw std::runtime_error(fmt::format(
            "{}: the checkpoint was trained on data of tokenizer {} (vocab_size {}, fingerprint {:016x}); this run's "
            "data {} has tokenizer {} (vocab_size {}, fingerprint {:016x}): resume on the same data",
            (d / data::DataRecord::kFile).string(), record->tokenizer, record->vocab_size,
            record->tokenizer_fingerprint, state_->data_dir, meta.tokenizer, meta.vocab_size,
            meta.tokenizer_fingerprint));
      }
    }
  }
  if (loader_) {
    const fs::path file = d / "loader_state.json";
    try {
      data::LoaderState loader_state = data::LoaderState::from_json(read_text(file));
      loader_state.rank = rank();  // rank 0 wrote it; every rank is at the same position of its own share
      loader_->restore(loader_state);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(fmt::format("{}: {}", file.string(), e.what()));
    }
  }
  if (state_->global_step > plan_.total_steps) {
    throw std::runtime_error(fmt::format("{}: global_step {} is past this run's {} steps",
                                         (d / "trainer_state.json").string(), state_->global_step, plan_.total_steps));
  }
}

}  // namespace kiln::train
