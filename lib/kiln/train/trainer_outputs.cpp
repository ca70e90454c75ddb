// The trainer's outputs: the banner, evaluation, the metrics window's log line and entry, the
// output folder's recovery, and what HF's Trainer and LLaMA-Factory write at the end of a run.
#include <cmath>
#include <fstream>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/common/device.h"
#include "kiln/common/format.h"
#include "kiln/common/logger.h"
#include "kiln/cost/memory.h"
#include "kiln/data/loader.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/io/safetensors.h"
#include "kiln/model/hf.h"
#include "kiln/ops/dispatch.h"
#include "kiln/train/checkpoint_dir.h"
#include "kiln/train/evaluate.h"
#include "kiln/train/hf/checkpoint_layout.h"
#include "kiln/train/hf/loss_plot.h"
#include "kiln/train/hf/run_outputs.h"
#include "kiln/train/stop_request.h"
#include "kiln/train/trainer_internal.h"
#include "kiln/train/training_data.h"
#include "kiln/version.h"

namespace kiln::train {

std::string Trainer::banner() const {
  std::string out = run_banner(plan_, comm_.get());
  if (config_.train_from_scratch && !config_.model_name_or_path.empty()) {
    const std::string config_json = (fs::path(config_.model_name_or_path) / kModelConfigFile).string();
    const std::string tokenizer = model_tokenizer_spec(config_);
    const std::string tokenizer_line =
        !config_.llamafactory_data() ? ""
        : tokenizer == "byte" ? fmt::format("; tokenizer byte ({} has no tokenizer.json)", config_.model_name_or_path)
                              : fmt::format("; tokenizer {}", tokenizer);
    if (state_->global_step > 0) {
      out += fmt::format("\n  Model = {} (train_from_scratch), its weights from the resumed checkpoint{}", config_json,
                         tokenizer_line);
    } else {
      out += fmt::format(
          "\n  Model = initialised at random from {} (train_from_scratch: seed {}, N(0, {}) for linear and "
          "embedding weights, norms at 1, as transformers' _init_weights){}",
          config_json, config_.seed, model_->config().initializer_range > 0 ? model_->config().initializer_range : 0.02,
          tokenizer_line);
    }
  }
  if (state_->global_step > 0) out += fmt::format("\n  Resuming at step {}", with_commas(state_->global_step));
  return out;
}

EvalOptions Trainer::eval_options() {
  EvalOptions o;
  o.batch_size = config_.per_device_eval_batch_size;
  o.device = device_;
  o.autocast_dtype = autocast_dtype_;
  o.neat_packing = config_.neat_packing;
  o.ignore_label_id = plan_.data.ignored_label_id;
  o.should_stop = [this] { return stop_requested(); };
  o.rank = rank();
  o.world_size = world_size();
  if (comm_) {
    o.host_sum = [this](std::vector<double> v) { return comm_->host_sum(std::move(v)); };
    o.host_max = [this](std::vector<int64_t> v) { return comm_->host_max(std::move(v)); };
  }
  return o;
}

EvalResult Trainer::evaluate() {
  if (plan_.data.eval_stream) {
    const ops::BackendScope kernels(config_.kernels);
    const bool training = model_->is_training();
    EvalResult r = evaluate_stream(model_, *plan_.data.eval_stream, eval_options());
    model_->train(training);
    return r;
  }
  if (!plan_.data.val) {
    throw std::runtime_error(source_ ? "evaluate: this trainer's batches come from the host; pass an evaluation source"
                                     : "evaluate: the dataset has no 'val' split");
  }
  const ops::BackendScope kernels(config_.kernels);
  const bool training = model_->is_training();
  EvalResult r = evaluate_dataset(model_, plan_.data.val, eval_options());
  model_->train(training);
  return r;
}

EvalResult Trainer::evaluate(const BatchSource& source) {
  const ops::BackendScope kernels(config_.kernels);
  const bool training = model_->is_training();
  EvalResult r = evaluate_batches(
      model_,
      [&]() -> std::optional<MicroBatch> {
        std::optional<MicroBatch> b = source();
        if (b) check_host_batch(*b, model_->config().vocab_size);
        return b;
      },
      eval_options());
  model_->train(training);
  return r;
}

void Trainer::log_metrics(const std::string& json_line) {
  if (callbacks_.on_log) callbacks_.on_log(json_line);
  if (!is_main()) return;
  append_line((fs::path(config_.output_dir) / kMetricsFile).string(), json_line);
}

void Trainer::prepare_output_dir() {
  // Rank 0 alone tidies the (shared) output folder; the others wait for it.
  if (is_main()) prepare_output_dir_on_main();
  if (comm_) comm_->barrier();
}

void Trainer::clean_incomplete_on_main() {
  const fs::path out(config_.output_dir);
  const auto cleaned = clean_incomplete_checkpoints(out);
  if (!cleaned.empty()) {
    logger()->info("kiln-pretrain: {}: cleaned up {} incomplete checkpoint folder{} of an interrupted save ({})",
                   out.string(), cleaned.size(), cleaned.size() == 1 ? "" : "s", fmt::join(cleaned, "; "));
  }
}

void Trainer::prepare_output_dir_on_main() {
  const fs::path out(config_.output_dir);
  fs::create_directories(out);
  clean_incomplete_on_main();
  // LLaMA-Factory's LogCallback.on_init_end: an earlier run's log goes only with overwrite_output_dir.
  if (const fs::path log = out / kTrainerLogFile; config_.overwrite_output_dir && fs::exists(log)) {
    logger()->info("kiln-pretrain: {}: previous trainer log deleted (overwrite_output_dir)", log.string());
    fs::remove(log);
  }
  state_->folder_files(config_, model_->config(),
                       plan_.data.shards.get());  // a bad tokenizer folder fails now, not at the first save
  const SetAside aside =
      set_aside_later_checkpoints(out, state_->global_step, state_->resumed_from, config_.overwrite_output_dir);
  if (!aside.checkpoints.empty()) {
    std::vector<std::string> names;
    for (const auto& p : aside.checkpoints) names.push_back(p.filename().string());
    logger()->info(
        "kiln-pretrain: {}: {} ({}) of an earlier run, past this run's start at step {}: {}", out.string(),
        aside.checkpoints.size() == 1 ? "a checkpoint" : "checkpoints", fmt::join(names, ", "), state_->global_step,
        aside.folder ? fmt::format("moved to {}", aside.folder->string()) : "deleted (overwrite_output_dir)");
  }
}

// ---- One train() call's window, evaluations and closing summary ------------------------------

void Trainer::Run::reset_window() {
  st.window_loss_sum = at::zeros({}, fopts);
  st.window_good_targets = at::zeros({}, fopts);
  st.window_steps = 0;
  st.window_tokens = 0;
  st.window_comm_seconds = 0;
  st.window_start = std::chrono::steady_clock::now();
}

// A log_history entry: into trainer_state.json's history and TensorBoard, and (a training window
// or an evaluation, not the closing summary) metrics.jsonl and on_log.
void Trainer::Run::record(const json& entry, bool to_metrics) {
  st.log_history.push_back(entry);
  if (to_metrics) t.log_metrics(entry.dump());
  if (t.is_main()) {
    // LLaMA-Factory's LogCallback: one line per log entry, the summary's included; timed from this
    // call's start, as its on_train_begin.
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
    append_line((fs::path(t.config_.output_dir) / kTrainerLogFile).string(),
                trainer_log_line(entry, entry.at("step").get<int64_t>(), t.plan_.steps.total_steps, elapsed));
  }
  if (st.tensorboard) st.tensorboard->add_scalars(entry.at("step").get<int64_t>(), tensorboard_scalars(entry));
}

void Trainer::Run::log_window(int64_t step) {
  const PretrainConfig& c = t.config_;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - st.window_start).count();
  const double first_bad = st.first_bad_step.item<double>();  // the one host sync of the window
  if (first_bad >= 0 && c.nan_policy == "stop") {
    throw NonFiniteLossError(
        fmt::format("non-finite loss or gradient at step {} (nan_policy: stop; the update of that step was skipped). "
                    "Lower learning_rate, use bf16 instead of fp16, or set nan_policy: skip",
                    static_cast<int64_t>(first_bad)));
  }
  const double good = st.window_good_targets.item<double>();
  const double loss = good > 0 ? st.window_loss_sum.item<double>() / good : NAN;
  const double tokens_per_s = static_cast<double>(st.window_tokens) / seconds;
  json entry = {{"loss", loss},
                {"grad_norm", last_norm ? last_norm->item<double>() : 0.0},
                {"learning_rate", last_lr},
                {"epoch", t.epoch_of(step)},
                {"step", step},
                {"tokens_per_second", tokens_per_s},
                {"peak_memory_bytes", device::peak_memory_bytes(t.device_)}};
  if (st.peak) {
    // Per device: the job's tokens/s over its world size.
    const double per_device = tokens_per_s / t.world_size();
    entry["tflops"] = st.flops.train() * per_device / 1e12;
    entry["mfu"] = st.flops.train() * per_device / (st.peak->tflops * 1e12);
  }
  // Host waits measure exposed communication on the CPU (Gloo); NCCL's waits only order streams.
  if (t.data_parallel() && t.device_.is_cpu()) entry["comm_wait_share"] = st.window_comm_seconds / seconds;
  if (first_bad >= 0) entry["skipped_nonfinite_since_step"] = static_cast<int64_t>(first_bad);
  record(entry);
  if (std::isfinite(loss)) {
    session_loss_sum += loss * static_cast<double>(st.window_steps);
    session_loss_steps += st.window_steps;
  }
  result.final_loss = loss;
  st.first_bad_step.fill_(-1.0);
  reset_window();
  if (!t.is_main()) return;
  bar->clear();
  logger()->info("{{'loss': {:.4f}, 'grad_norm': {:.4f}, 'learning_rate': {:.3e}, 'epoch': {:.2f}}}  {}/s{}, peak {}",
                 loss, entry["grad_norm"].get<double>(), last_lr, entry["epoch"].get<double>(),
                 with_commas(static_cast<int64_t>(tokens_per_s)) + " tokens",
                 st.peak ? fmt::format(", MFU {:.1f}% of {:.3g} TFLOP/s ({})", entry["mfu"].get<double>() * 100,
                                       st.peak->tflops, st.peak->name)
                         : "",
                 human_bytes(entry["peak_memory_bytes"].get<double>()));
  bar->print_line();
}

json Trainer::Run::eval_entry(const EvalSet& set, const EvalResult& ev, double seconds, int64_t step) const {
  // HF's evaluation entry (speed_metrics(prefix), rounded as there) plus kiln's perplexity and
  // tokens. With eval_on_each_dataset HF's Trainer.evaluate prefixes each dataset's metrics
  // eval_<name> (one entry per dataset). A stream has no length: the examples seen
  // (evaluation_loop's observed_num_examples).
  const std::string& prefix = set.prefix;
  const double samples = static_cast<double>(set.set ? set.set->num_blocks() : ev.examples);
  const double batches =
      std::ceil(samples / static_cast<double>(t.config_.per_device_eval_batch_size * t.world_size()));
  return {{prefix + "_loss", ev.loss},
          {prefix + "_perplexity", ev.perplexity},
          {prefix + "_tokens", ev.tokens},
          {prefix + "_runtime", std::round(seconds * 1e4) / 1e4},
          {prefix + "_samples_per_second", std::round(samples / seconds * 1e3) / 1e3},
          {prefix + "_steps_per_second", std::round(batches / seconds * 1e3) / 1e3},
          {"epoch", t.epoch_of(step)},
          {"step", step}};
}

std::optional<std::vector<json>> Trainer::Run::evaluate_sets(int64_t step) {
  std::vector<json> entries;
  for (const EvalSet& set : t.plan_.data.eval_sets()) {
    const std::string& prefix = set.prefix;
    if (t.is_main()) {
      bar->clear();
      logger()->info("{}", evaluation_banner(set.set ? std::optional<int64_t>(set.set->num_blocks()) : std::nullopt,
                                             t.config_.per_device_eval_batch_size));
    }
    const auto eval_start = std::chrono::steady_clock::now();
    const ops::BackendScope kernels(t.config_.kernels);
    const EvalResult ev = set.set ? evaluate_dataset(t.model_, set.set, t.eval_options())
                                  : evaluate_stream(t.model_, *set.stream, t.eval_options());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
    t.model_->train();
    if (ev.interrupted) return std::nullopt;
    st.last_eval = ev;
    if (t.callbacks_.on_evaluate) t.callbacks_.on_evaluate(step, ev);
    entries.push_back(eval_entry(set, ev, seconds, step));
    if (t.is_main()) {
      bar->clear();
      logger()->info("{{'{}_loss': {:.4f}, '{}_perplexity': {:.3f}, 'step': {}}}", prefix, ev.loss, prefix,
                     ev.perplexity, step);
    }
  }
  return entries;
}

EvalSchedule Trainer::Run::schedule() const {
  const EvalSchedule s = eval_schedule(t.config_, t.plan_.steps.total_steps);
  if (s.required && t.plan_.data.eval_sets().empty()) {
    // LLaMA-Factory refuses the same YAML (hparams/parser.py: "Please make sure eval_dataset be
    // provided or val_size >1e-6").
    throw std::runtime_error(fmt::format("{}: {} needs evaluation data: set val_size{}", t.config_.source,
                                         t.config_.do_eval == 1 ? "do_eval: true" : "eval_strategy: steps",
                                         t.source_ ? " (a host's batches: evaluate with Trainer::evaluate(source))"
                                                   : ", or give shards with a val split"));
  }
  return s;
}

bool Trainer::Run::evaluate_at(int64_t step) {
  if (t.plan_.data.eval_sets().empty()) return true;
  const auto entries = evaluate_sets(step);
  if (!entries) return false;
  session_eval = st.last_eval;
  for (const json& entry : *entries) record(entry);
  last_eval_entries = *entries;
  last_eval_step = step;
  st.window_start = std::chrono::steady_clock::now();  // evaluation time is not training speed
  return true;
}

// HF's closing summary entry, then what LLaMA-Factory's run_pt writes into output_dir (rank 0), in
// its order: Trainer.save_model (the model, its tokenizer files, training_args), save_metrics
// ("train"), save_state, plot_loss, the do_eval evaluation and save_metrics("eval"), the model
// card. A run cut short by a stop request leaves its checkpoint, not a final model.
TrainResult Trainer::Run::finish() {
  const PretrainConfig& c = t.config_;
  bar->finish();
  const double runtime = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
  const int64_t steps_trained = st.global_step - start_step;
  const double samples = static_cast<double>(steps_trained * t.plan_.steps.total_batch_size());
  json summary = {{"train_runtime", std::round(runtime * 1e4) / 1e4},
                  {"train_samples_per_second", runtime > 0 ? std::round(samples / runtime * 1e3) / 1e3 : 0.0},
                  {"train_steps_per_second", runtime > 0 ? std::round(steps_trained / runtime * 1e3) / 1e3 : 0.0},
                  {"total_flos", st.total_flos},
                  {"train_loss", session_loss_steps > 0 ? session_loss_sum / static_cast<double>(session_loss_steps)
                                                        : static_cast<double>(NAN)},
                  {"epoch", t.epoch_of(st.global_step)},
                  {"step", st.global_step}};
  record(summary, /*to_metrics=*/false);
  const bool complete = !result.interrupted;
  if (t.is_main()) {
    summary.erase("step");
    if (complete) save_final_model();
    save_metrics(c.output_dir, "train", summary);
    io::write_file_atomic((fs::path(c.output_dir) / kTrainerStateFile).string(),
                          trainer_state_text(t.hf_trainer_state(st.global_step)));
    if (c.plot_loss) {
      std::vector<std::string> keys = {"loss"};
      for (const EvalSet& set : t.plan_.data.eval_sets()) keys.push_back(set.prefix + "_loss");
      plot_loss(c.output_dir, st.log_history, keys);
    }
  }
  // do_eval: after training, not logged (LLaMA-Factory's log writer has closed, and
  // trainer_state.json is written); an evaluation of this very step is not repeated.
  json card_history = st.log_history;
  std::vector<json> final_entries;
  if (complete && evals.after_training && !t.plan_.data.eval_sets().empty()) {
    if (session_eval && last_eval_step == st.global_step) {
      final_entries = last_eval_entries;
    } else if (const auto entries = evaluate_sets(st.global_step)) {
      final_entries = *entries;
      for (const json& entry : final_entries) card_history.push_back(entry);
    } else {
      result.interrupted = true;
      if (t.is_main()) {
        logger()->info(
            "kiln-pretrain: {} received during the evaluation after training (do_eval): no eval_results.json",
            stop_signal_name(pending_stop_signal().exchange(0)));
      }
    }
  }
  if (t.is_main()) {
    if (!final_entries.empty()) {
      // LLaMA-Factory's eval metrics: HF's (epoch, <prefix>_loss, speeds) and <prefix>_perplexity =
      // exp(<prefix>_loss), per eval set (HF's Trainer.evaluate merges the sets' metrics).
      json metrics = json::object();
      for (const json& entry : final_entries) {
        for (const auto& [key, value] : entry.items()) {
          const bool kiln_only = key.size() > 7 && key.compare(key.size() - 7, 7, "_tokens") == 0;
          if (key != "step" && !kiln_only) metrics[key] = value;
        }
      }
      save_metrics(c.output_dir, "eval", metrics);
    }
    if (complete) {
      std::string name = c.output_dir;
      while (name.size() > 1 && name.back() == '/') name.pop_back();
      name = fs::path(name).filename().string();
      if (name == "." || name.empty()) name = c.model_name_or_path;
      std::vector<std::string> datasets;
      for (size_t start = 0; !c.dataset.empty() && start <= c.dataset.size();) {
        const size_t comma = std::min(c.dataset.find(',', start), c.dataset.size());
        std::string d = c.dataset.substr(start, comma - start);
        d.erase(0, d.find_first_not_of(" \t"));
        d.erase(d.find_last_not_of(" \t") + 1);
        datasets.push_back(d);
        start = comma + 1;
      }
      // A model initialised from config.json (train_from_scratch) is fine-tuned from nothing: HF's
      // card says "trained from scratch" with no base_model. LLaMA-Factory passes
      // finetuned_from=model_name_or_path whatever the mode; kiln does not claim the config folder's
      // weights (docs/llamafactory.md).
      const ModelCard card{.model_name = name,
                           .finetuned_from = c.train_from_scratch ? "" : c.model_name_or_path,
                           .datasets = datasets,
                           .log_history = card_history,
                           .hyperparameters = card_hyperparameters(c, t.world_size()),
                           .framework_versions = {fmt::format("kiln {}", KILN_VERSION_STRING),
                                                  fmt::format("LibTorch {}", KILN_TORCH_VERSION_STRING)}};
      io::write_file_atomic((fs::path(c.output_dir) / kModelCardFile).string(), model_card_text(card));
    }
  }
  st.tensorboard.reset();
  result.global_step = st.global_step;
  result.final_eval = st.last_eval;
  return result;
}

void Trainer::Run::save_final_model() {
  const std::string dir = t.config_.output_dir;
  const ModelFolderFiles& files = st.folder_files(t.config_, t.model_->config(), t.plan_.data.shards.get());
  model::save_pretrained(t.model_, dir, save_options_for(files));
  write_model_folder_files(files, dir);
  io::write_file_atomic((fs::path(dir) / kTrainingArgsFile).string(), pretrain_config_json(t.config_));
  // kiln-generate and kiln-eval read the tokenizer and BOS convention from it, as in a checkpoint.
  if ((t.loader_ || t.stream_) && t.plan_.data.shards) {
    io::write_file_atomic((fs::path(dir) / data::DataRecord::kFile).string(),
                          data::DataRecord::of(t.plan_.data.dir, t.plan_.data.shards->meta()).to_json());
  }
}

}  // namespace kiln::train
