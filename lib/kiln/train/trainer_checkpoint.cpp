// Checkpoints: save (model, optimizer shards, loader and random states, HF's trainer_state.json)
// and resume exactly, with HF's fractional epoch and trainer state.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/common/logger.h"
#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "kiln/data/stream_dataset.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/io/input_file.h"
#include "kiln/io/safetensors.h"
#include "kiln/io/torch_pickle.h"
#include "kiln/model/hf.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/grad.h"
#include "kiln/train/checkpoint_dir.h"
#include "kiln/train/checkpoint_files.h"
#include "kiln/train/hf/checkpoint_layout.h"
#include "kiln/train/hf/hf_optimizer_files.h"
#include "kiln/train/hf/run_outputs.h"
#include "kiln/train/trainer_internal.h"
#include "kiln/train/training_data.h"

namespace kiln::train {

// HF's state.epoch: the batches consumed so far over the batches per epoch. An epoch's last
// window may be shorter than gradient_accumulation_steps (step_plan.h).
double Trainer::epoch_of(int64_t step) const {
  if (stream_) {
    // A stream's epochs end where its data does: the loader's position after the step (every
    // caller asks at the current step), over steps_in_epoch = max_steps x accumulation.
    return data::stream_epoch_progress(*stream_, plan_.steps.total_steps, config_.gradient_accumulation_steps);
  }
  const int64_t per_epoch = std::max<int64_t>(plan_.steps.updates_per_epoch, 1);
  const int64_t batches = std::max<int64_t>(plan_.steps.batches_per_epoch, 1);
  const int64_t consumed =
      (step / per_epoch) * batches + std::min(step % per_epoch * config_.gradient_accumulation_steps, batches);
  return static_cast<double>(consumed) / static_cast<double>(batches);
}

HfTrainerState Trainer::hf_trainer_state(int64_t step) const {
  HfTrainerState s;
  s.global_step = step;
  s.epoch = epoch_of(step);
  s.max_steps = plan_.steps.total_steps;
  // TrainerState.compute_steps: the intervals resolved against the run's steps.
  s.logging_steps = resolve_steps(config_.logging_steps, plan_.steps.total_steps);
  s.eval_steps =
      resolve_steps(config_.eval_steps > 0 ? config_.eval_steps : config_.logging_steps, plan_.steps.total_steps);
  s.save_steps = resolve_steps(config_.save_steps, plan_.steps.total_steps);
  s.train_batch_size = config_.per_device_train_batch_size;
  const int64_t per_epoch = std::max<int64_t>(plan_.steps.updates_per_epoch, 1);
  // A stream's: sys.maxsize, as set_initial_training_values gives it.
  s.num_train_epochs =
      plan_.steps.streamed ? plan_.steps.banner_epochs() : (plan_.steps.total_steps + per_epoch - 1) / per_epoch;
  s.total_flos = state_->total_flos;
  s.log_history = state_->log_history;
  return s;
}

const ModelFolderFiles& Trainer::State::folder_files(const PretrainConfig& config, const model::LlamaConfig& mc,
                                                     const data::TokenShards* shards) {
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
  // generation_config.json: the folder's, as from_pretrained loads it; a model made from config.json
  // (train_from_scratch: from_config) starts from GenerationConfig.from_model_config, as there.
  const std::string model_dir = config.train_from_scratch ? "" : config.model_name_or_path;
  model_files = std::make_shared<const ModelFolderFiles>(
      model_folder_files(tokenizer, bos, eos, model_dir, mc.bos_token_id, mc.eos_token_id));
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

// Every parameter's whole AdamW state in HF's layout, on rank 0's CPU (empty on the other ranks).
// With ZeRO each rank holds chunk r of every bucket: the chunks are all-gathered bucket by bucket
// (a collective: every rank calls this), so no rank ever holds more than one bucket of them
// beyond what rank 0 keeps.
std::vector<HfParamState> gather_hf_state(const model::LlamaForCausalLM& model, const optim::AdamW& optimizer,
                                          const dist::DataParallel* dp, bool main) {
  const std::map<std::string, at::Tensor> sd = optimizer.state_dict();
  std::vector<HfParamState> out;
  if (!dp || dp->zero_stage() == 0) {
    if (!main) return out;
    for (const HfParamShape& p : hf_param_shapes(model)) {
      out.push_back({p.name, p.decay, sd.at(p.name + ".exp_avg").to(at::kCPU),
                     sd.at(p.name + ".exp_avg_sq").to(at::kCPU), sd.at(p.name + ".step").item<double>()});
    }
    return out;
  }
  const auto& params = dp->params();
  const int rank = dp->comm().rank();
  std::map<std::string, HfParamState> full;
  std::vector<int64_t> steps(params.size(), -1);
  for (const dist::Bucket& bucket : dp->buckets()) {
    const int64_t chunk = bucket.chunk(), lo = bucket.offset + rank * chunk, hi = lo + chunk;
    const at::TensorOptions opts = params[static_cast<size_t>(bucket.params.front())].param.options();
    at::Tensor local_m = at::zeros({chunk}, opts), local_v = at::zeros({chunk}, opts);
    for (const int64_t i : bucket.params) {
      const dist::FlatParam& fp = params[static_cast<size_t>(i)];
      const int64_t s = std::max(lo, fp.offset), e = std::min(hi, fp.offset + fp.numel);
      if (s >= e) continue;
      const std::string name = fmt::format("{}[{}:{}]", fp.name, s - fp.offset, e - fp.offset);
      local_m.narrow(0, s - lo, e - s).copy_(sd.at(name + ".exp_avg"));
      local_v.narrow(0, s - lo, e - s).copy_(sd.at(name + ".exp_avg_sq"));
      steps[static_cast<size_t>(i)] = static_cast<int64_t>(sd.at(name + ".step").item<double>());
    }
    at::Tensor all_m = at::empty({bucket.numel}, opts), all_v = at::empty({bucket.numel}, opts);
    dp->comm().all_gather(all_m, local_m)->wait();
    dp->comm().all_gather(all_v, local_v)->wait();
    if (!main) continue;
    for (const int64_t i : bucket.params) {
      const dist::FlatParam& fp = params[static_cast<size_t>(i)];
      const auto piece = [&](const at::Tensor& all) {
        return all.narrow(0, fp.offset - bucket.offset, fp.numel).view(fp.param.sizes()).to(at::kCPU).clone();
      };
      full[fp.name] = {fp.name, fp.param.dim() > 1, piece(all_m), piece(all_v), 0};
    }
  }
  steps = dp->comm().host_max(steps);  // each parameter's step, from a rank that holds part of it
  for (size_t i = 0; i < params.size(); ++i) {
    if (main) full.at(params[i].name).step = static_cast<double>(steps[i]);
  }
  if (!main) return out;
  for (const HfParamShape& p : hf_param_shapes(model)) out.push_back(std::move(full.at(p.name)));
  return out;
}

}  // namespace

std::string Trainer::save_checkpoint(int64_t step) {
  // Data parallel: rank 0 prepares the folder; every rank writes its part into it; once all have
  // (a barrier), rank 0 renames it into place, so a checkpoint-N folder is whole or absent.
  State& st = *state_;
  const fs::path final_dir = fs::path(config_.output_dir) / checkpoint_folder_name(step);
  if (st.last_saved_step == step && fs::is_directory(final_dir)) return final_dir.string();
  // The checkpoint a run resumed from is never rewritten (a resume at its own last step ends
  // where it started): it may be transformers' or someone's download, with files kiln does not write.
  if (std::error_code ec; !st.resumed_from.empty() && fs::equivalent(final_dir, st.resumed_from, ec)) {
    if (is_main())
      logger()->info("kiln-pretrain: {} is the checkpoint this run resumed from: kept as it is", final_dir.string());
    st.last_saved_step = step;
    return final_dir.string();
  }
  const fs::path tmp = fs::path(config_.output_dir) / fmt::format(".{}.tmp", checkpoint_folder_name(step));
  if (is_main()) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  if (comm_) comm_->barrier();
  const bool sharded = stack_->data_parallel() && zero_stage_ > 0;
  if (is_main() || sharded) {
    io::NamedTensors opt;
    for (const auto& [name, t] : stack_->optimizer().state_dict()) opt.emplace_back(name, t);
    if (stack_->scaler()) {
      opt.emplace_back("grad_scaler.scale", stack_->scaler()->scale());
      opt.emplace_back("grad_scaler.growth_tracker", stack_->scaler()->growth_tracker());
    }
    const std::string file = sharded ? optimizer_shard_file(rank(), world_size()) : kKilnOptimizerFile;
    io::save_safetensors((tmp / file).string(), opt);
  }
  // transformers' optimizer.pt, scheduler.pt (and scaler.pt), so that its Trainer (and LLaMA-Factory)
  // continues this run from the checkpoint (docs/training.md, "Moving a run between LLaMA-Factory and kiln").
  const std::vector<HfParamState> hf_state =
      gather_hf_state(model_, stack_->optimizer(), stack_->data_parallel(), is_main());
  if (is_main()) {
    const optim::ScheduleConfig sched = schedule_of(config_, plan_.steps.total_steps);
    const double next_lr = step_learning_rate(config_, sched, std::min(step, plan_.steps.total_steps));
    const HfAdamWHyper hyper{.lr = next_lr,
                             .initial_lr = config_.learning_rate,
                             .beta1 = config_.adam_beta1,
                             .beta2 = config_.adam_beta2,
                             .eps = config_.adam_epsilon,
                             .weight_decay = config_.weight_decay};
    io::save_torch_pickle((tmp / kHfOptimizerFile).string(), hf_adamw_state_dict(hf_state, hyper));
    io::save_torch_pickle((tmp / kHfSchedulerFile).string(),
                          hf_lambda_lr_state_dict(config_.learning_rate, step, next_lr));
    if (stack_->scaler()) {
      io::save_torch_pickle((tmp / kHfScalerFile).string(),
                            hf_grad_scaler_state_dict(stack_->scaler()->scale().item<double>(),
                                                      stack_->scaler()->growth_tracker().item<int64_t>()));
    }
  }
  const at::Tensor cpu_rng = cpu_rng_state();
  io::save_safetensors((tmp / rng_state_file(rank(), world_size())).string(), {{"cpu", cpu_rng}});
  if (is_main()) {
    // The model folder as LLaMA-Factory's checkpoints hold it: the tokenizer files, chat template,
    // generation config and the run's arguments (training_args.json for HF's pickled .bin).
    const ModelFolderFiles& files = st.folder_files(config_, model_->config(), plan_.data.shards.get());
    model::save_pretrained(model_, tmp.string(), save_options_for(files));
    write_model_folder_files(files, tmp.string());
    io::write_file_atomic((tmp / kTrainingArgsFile).string(), pretrain_config_json(config_));
    if (loader_ || stream_) {  // a host's batches have no position kiln could restore
      io::write_file_atomic((tmp / kLoaderStateFile).string(),
                            (loader_ ? loader_->state() : stream_->state()).to_json());
      io::write_file_atomic((tmp / data::DataRecord::kFile).string(),
                            data::DataRecord::of(plan_.data.dir, plan_.data.shards->meta()).to_json());
    }
    // HF's trainer_state.json (TrainerState.load_from_json reads it); kiln's own facts beside it.
    io::write_file_atomic((tmp / kTrainerStateFile).string(), trainer_state_text(hf_trainer_state(step)));
    const json kiln_state = {{"world_size", world_size()}, {"zero_stage", stack_->data_parallel() ? zero_stage_ : 0}};
    io::write_file_atomic((tmp / kKilnStateFile).string(), kiln_state.dump(2) + "\n");
  }
  if (comm_) comm_->barrier();  // every rank's part is on disk
  if (is_main()) {
    replace_folder_atomically(tmp, final_dir, written_by_checkpoint_save);
    rotate_checkpoints(config_.output_dir, config_.save_total_limit, {final_dir, fs::path(st.resumed_from)});
  }
  if (comm_) comm_->barrier();
  st.last_saved_step = step;
  if (callbacks_.on_save) callbacks_.on_save(step, final_dir.string());
  return final_dir.string();
}

void Trainer::resume(const std::string& dir) {
  const fs::path d(dir);
  // output_dir's own files (trainer_state.json, all_results.json, ...) would overwrite the checkpoint's.
  if (std::error_code ec; fs::equivalent(config_.output_dir, d, ec)) {
    throw std::runtime_error(fmt::format(
        "{}: output_dir {} is the checkpoint being resumed (resume_from_checkpoint), whose files the run's outputs "
        "would overwrite: give the run its own output_dir (the checkpoint's parent, for one)",
        config_.source, config_.output_dir));
  }
  state_->resumed_from = dir;
  // DeepSpeed's checkpoints keep the optimizer state in its own partitioned files.
  if (const auto ds = deepspeed_state_folder(d)) {
    throw std::runtime_error(fmt::format(
        "resume_from_checkpoint: {} holds DeepSpeed's {}/ (its partitioned optimizer state), which kiln does not "
        "read: convert the weights with the zero_to_fp32.py that DeepSpeed wrote beside it and start from them "
        "(model_name_or_path), or resume the run in DeepSpeed",
        dir, *ds));
  }
  // A checkpoint of transformers' Trainer (LLaMA-Factory's): none of kiln's own files.
  const bool from_hf = is_hf_trainer_checkpoint(d);
  for (const char* f : resume_required_files(from_hf, /*host_batches=*/static_cast<bool>(source_))) {
    if (!fs::exists(d / f)) {
      throw std::runtime_error(fmt::format(
          "resume_from_checkpoint: {} is neither a kiln checkpoint nor one of transformers' Trainer (no {})", dir, f));
    }
  }
  // trainer_state.json (HF's TrainerState), then kiln_state.json: read bounded, numbers checked.
  const std::string ts_file = (d / kTrainerStateFile).string();
  TrainerStateFile ts = read_trainer_state_file(ts_file);
  state_->global_step = ts.global_step;
  state_->log_history = std::move(ts.log_history);
  state_->total_flos = ts.total_flos;
  if (from_hf) {
    resume_from_hf(dir, ts.max_steps);
    return;
  }
  // The data order and the optimizer shards depend on the world size: resume on the same one.
  // Checkpoints of kiln 0.2 kept kiln_state.json's keys in trainer_state.json.
  const std::string state_file = fs::exists(d / kKilnStateFile) ? (d / kKilnStateFile).string() : ts_file;
  const KilnStateFile saved = read_kiln_state_file(state_file);
  const int64_t saved_world = saved.world_size, saved_stage = saved.zero_stage;
  const int64_t stage = stack_->data_parallel() ? zero_stage_ : 0;
  if (saved_world != world_size() || (saved_stage != stage && (saved_stage > 0 || stage > 0))) {
    throw std::runtime_error(
        fmt::format("resume_from_checkpoint: {} was written by {} process{} with zero_stage {} ({}); this run has {} "
                    "with zero_stage {}. Resume with the same world size and stage (docs/distributed.md)",
                    dir, saved_world, saved_world == 1 ? "" : "es", saved_stage,
                    fs::path(state_file).filename().string(), world_size(), stage));
  }
  const bool sharded = stage > 0;
  const std::string opt_file = sharded ? optimizer_shard_file(rank(), world_size()) : kKilnOptimizerFile;
  if (!fs::exists(d / opt_file)) {
    throw std::runtime_error(fmt::format("resume_from_checkpoint: {} is not a kiln checkpoint (no {})", dir, opt_file));
  }
  io::SafetensorsCheckpoint weights(dir);
  model::load_weights(*model_, weights, dir);

  io::SafetensorsFile opt((d / opt_file).string());
  std::map<std::string, at::Tensor> state;
  for (const auto& name : opt.names()) state[name] = opt.tensor(name);
  try {
    stack_->optimizer().load_state_dict(state, state_->global_step);
  } catch (const optim::StateError& e) {
    io::refuse(opt.path(), e.key(), e.expected(), e.found());
  }
  if (stack_->scaler() && opt.contains("grad_scaler.scale")) {
    const at::Tensor scale = opt.tensor("grad_scaler.scale"), tracker = opt.tensor("grad_scaler.growth_tracker");
    const auto one_number = [](const at::Tensor& t) { return t.numel() == 1 && !at::isComplexType(t.scalar_type()); };
    if (!one_number(scale) || !std::isfinite(scale.item<double>()) || scale.item<double>() <= 0)
      io::refuse(opt.path(), "grad_scaler.scale", "one finite number > 0",
                 c10::str(scale.sizes(), " ", scale.scalar_type()));
    if (!one_number(tracker) || !(tracker.item<double>() >= 0) || tracker.item<double>() > 2147483647.0)
      io::refuse(opt.path(), "grad_scaler.growth_tracker", "one whole number in [0, 2^31)",
                 c10::str(tracker.sizes(), " ", tracker.scalar_type()));
    stack_->scaler()->mutable_scale().copy_(scale.reshape(stack_->scaler()->scale().sizes()));
    stack_->scaler()->growth_tracker().copy_(tracker.reshape(stack_->scaler()->growth_tracker().sizes()));
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
  if ((loader_ || stream_) && plan_.data.shards) {
    // The checkpoint's data position applies to the data it was written for: the same tokenizer
    // (a position in other tokens would silently train on a different stream).
    if (const auto record = data::DataRecord::read(dir)) {
      const auto& meta = plan_.data.shards->meta();
      if (record->tokenizer_fingerprint != meta.tokenizer_fingerprint || record->vocab_size != meta.vocab_size) {
        throw std::runtime_error(fmt::format(
            "{}: the checkpoint was trained on data of tokenizer {} (vocab_size {}, fingerprint {:016x}); this run's "
            "data {} has tokenizer {} (vocab_size {}, fingerprint {:016x}): resume on the same data",
            (d / data::DataRecord::kFile).string(), record->tokenizer, record->vocab_size,
            record->tokenizer_fingerprint, plan_.data.dir, meta.tokenizer, meta.vocab_size,
            meta.tokenizer_fingerprint));
      }
    }
  }
  if (loader_ || stream_) {
    const std::string file = (d / kLoaderStateFile).string();
    data::LoaderState loader_state =
        data::LoaderState::from_json(io::read_input_file(file, io::kMaxJsonFileBytes), file);
    loader_state.rank = rank();  // rank 0 wrote it; every rank is at the same position of its own share
    try {
      // A stream is made again and fast-forwarded: O(documents consumed) time, constant memory.
      if (loader_) {
        loader_->restore(loader_state);
      } else {
        stream_->restore(loader_state);
      }
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(fmt::format("{}: {}", file, e.what()));
    }
  }
  if (state_->global_step > plan_.steps.total_steps) {
    io::refuse(ts_file, "global_step", fmt::format("at most this run's {} steps", plan_.steps.total_steps),
               fmt::format("{}", state_->global_step));
  }
}

void Trainer::resume_from_hf(const std::string& dir, int64_t saved_max_steps) {
  const fs::path d(dir);
  const std::string state_file = (d / kTrainerStateFile).string();
  // The schedule: its length from trainer_state.json, its type and warmup from the learning rate
  // that scheduler.pt holds for the saved step (LambdaLR keeps no more of it).
  const optim::ScheduleConfig sched = schedule_of(config_, plan_.steps.total_steps);
  if (saved_max_steps >= 0 && saved_max_steps != plan_.steps.total_steps) {
    io::refuse(state_file, "max_steps",
               fmt::format("this run's {} steps ({}; the learning-rate schedule would not continue otherwise: set "
                           "max_steps: {}, or the same epochs and data)",
                           plan_.steps.total_steps, config_.source, saved_max_steps),
               fmt::format("{}", saved_max_steps));
  }
  if (state_->global_step > plan_.steps.total_steps) {
    io::refuse(state_file, "global_step", fmt::format("at most this run's {} steps", plan_.steps.total_steps),
               fmt::format("{}", state_->global_step));
  }
  const std::string sched_file = (d / kHfSchedulerFile).string();
  const HfSchedulerState s = read_hf_lambda_lr(io::load_torch_pickle(sched_file), sched_file);
  if (s.last_epoch != state_->global_step) {
    io::refuse(sched_file, "last_epoch", fmt::format("global_step {} of {}", state_->global_step, kTrainerStateFile),
               fmt::format("{}", s.last_epoch));
  }
  // Relative closeness of finite numbers (read_hf_lambda_lr refused the others).
  const auto close = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); };
  for (size_t i = 0; i < s.base_lrs.size(); ++i) {
    if (!close(s.base_lrs[i], config_.learning_rate)) {
      io::refuse(sched_file, io::field_path("base_lrs", static_cast<int64_t>(i)),
                 fmt::format("this run's learning_rate {} ({})", config_.learning_rate, config_.source),
                 fmt::format("{}", s.base_lrs[i]));
    }
  }
  const double expected = step_learning_rate(config_, sched, s.last_epoch);
  for (size_t i = 0; i < s.last_lrs.size(); ++i) {
    if (!close(s.last_lrs[i], expected)) {
      io::refuse(sched_file, io::field_path("_last_lr", static_cast<int64_t>(i)),
                 fmt::format("{} at step {}: this run's schedule ({}: lr_scheduler_type {}, {} warmup steps over {} "
                             "steps)",
                             expected, s.last_epoch, config_.source, sched.type, sched.warmup_steps, sched.total_steps),
                 fmt::format("{}", s.last_lrs[i]));
    }
  }

  io::SafetensorsCheckpoint weights(dir);
  model::load_weights(*model_, weights, dir);

  load_hf_optimizer_file((d / kHfOptimizerFile).string(), model_, stack_->optimizer(),
                         stack_->data_parallel() && zero_stage_ > 0 ? stack_->data_parallel() : nullptr,
                         state_->global_step);
  if (const fs::path f = d / kHfScalerFile; stack_->scaler() && fs::exists(f)) {
    const HfScalerState sc = read_hf_grad_scaler(io::load_torch_pickle(f.string()), f.string());
    stack_->scaler()->mutable_scale().fill_(sc.scale);
    stack_->scaler()->growth_tracker().fill_(sc.growth_tracker);
  }
  if (fs::exists(d / kHfRngStateFile) && is_main()) {
    logger()->info(
        "kiln-pretrain: {}: ignored (the Python, numpy and torch random states of transformers' Trainer; "
        "kiln's data order follows the seed and the step)",
        (d / kHfRngStateFile).string());
  }
  if (stream_) {
    // transformers' position for an iterable train set: epochs_trained = global_step // max_steps
    // (num_update_steps_per_epoch = max_steps) and global_step % max_steps x accumulation batches
    // of that epoch's stream skipped (trainer.py:1549-1552, skip_first_batches at :1681),
    // whatever epochs the saved run had crossed; past that epoch's end it yields nothing and the
    // next epoch starts.
    const int64_t epoch = state_->global_step / plan_.steps.total_steps;
    const int64_t skip = state_->global_step % plan_.steps.total_steps * config_.gradient_accumulation_steps;
    if (!stream_->fast_forward(epoch, skip) && is_main()) {
      logger()->info(
          "kiln-pretrain: {}: transformers resumes a stream by skipping {} batches of epoch {}, which has fewer: "
          "it goes on with epoch {}, as LLaMA-Factory's own resume does",
          dir, skip, epoch, epoch + 1);
    }
  }
  if (loader_) {
    // transformers' position: the epochs done and the batches of this epoch to skip, from the step.
    data::LoaderState ls = loader_->state();
    const int64_t per_epoch = std::max<int64_t>(plan_.steps.updates_per_epoch, 1);
    ls.epoch = state_->global_step / per_epoch;
    ls.position = state_->global_step % per_epoch * config_.gradient_accumulation_steps;
    loader_->restore(ls);
  }
  if (is_main()) {
    logger()->info("kiln-pretrain: resuming transformers' checkpoint {} at step {} (epoch {}, {} batches into it)", dir,
                   state_->global_step, state_->global_step / std::max<int64_t>(plan_.steps.updates_per_epoch, 1),
                   state_->global_step % std::max<int64_t>(plan_.steps.updates_per_epoch, 1) *
                       config_.gradient_accumulation_steps);
  }
}

}  // namespace kiln::train
