// The training loop. Host/device discipline: between logging, evaluation and checkpoint points
// nothing here reads a device value; the loss sum, the non-finite check (which also makes the
// optimizer skip the update, inside its fused kernel) and the fp16 loss scale stay on the device.
//
// Micro-batches are drawn from the loader (epochs roll over inside it) in accumulation windows
// that start at each epoch's first batch, as HF Trainer's: an epoch's last window holds what is
// left (step_plan.h), so a checkpoint's loader state (epoch, position) alone restores the exact
// next batch and its window.
#include "kiln/train/trainer.h"

#include <cmath>
#include <fstream>
#include <optional>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/common/device.h"
#include "kiln/common/logger.h"
#include "kiln/common/nvtx.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/ops/dispatch.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/grad.h"
#include "kiln/train/checkpoint_dir.h"
#include "kiln/train/hf/run_outputs.h"
#include "kiln/train/stop_request.h"
#include "kiln/train/trainer_internal.h"

namespace kiln::train {

void check_host_batch(const MicroBatch& b, int64_t vocab_size) {
  if (!b.input_ids.defined() || !b.labels.defined())
    throw std::invalid_argument("host batch: input_ids and labels are required");
  if (b.input_ids.dim() != 2 || b.labels.sizes() != b.input_ids.sizes()) {
    throw std::invalid_argument(fmt::format("host batch: input_ids {} and labels {} must both be [batch, seq]",
                                            c10::str(b.input_ids.sizes()), c10::str(b.labels.sizes())));
  }
  if (b.input_ids.scalar_type() != at::kLong || b.labels.scalar_type() != at::kLong) {
    throw std::invalid_argument("host batch: input_ids and labels must be int64");
  }
  if (b.input_ids.size(1) < 2) throw std::invalid_argument("host batch: sequences need at least 2 tokens");
  const int64_t lo = b.input_ids.min().item<int64_t>(), hi = b.input_ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size) {
    throw std::invalid_argument(
        fmt::format("host batch: token id {} is outside the model's vocab_size {}", lo < 0 ? lo : hi, vocab_size));
  }
  // A label is a target id or -100 (ignored): the loss head indexes a row of logits by it.
  const at::Tensor scored = b.labels.ne(-100);
  const at::Tensor bad = scored.logical_and(b.labels.lt(0).logical_or(b.labels.ge(vocab_size)));
  if (bad.any().item<bool>()) {
    const int64_t first = bad.flatten().nonzero().min().item<int64_t>();
    throw std::invalid_argument(fmt::format("host batch: label {} is neither -100 nor inside the model's vocab_size {}",
                                            b.labels.flatten()[first].item<int64_t>(), vocab_size));
  }
  if (b.segment_ids.defined() && b.segment_ids.sizes() != b.input_ids.sizes()) {
    throw std::invalid_argument(fmt::format("host batch: segment_ids {} must match input_ids {}",
                                            c10::str(b.segment_ids.sizes()), c10::str(b.input_ids.sizes())));
  }
}

at::Tensor cpu_rng_state() {
  at::Generator gen = at::globalContext().defaultGenerator(at::kCPU);
  const std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(at::kCPU);
  const std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::string latest_checkpoint(const std::string& output_dir) {
  const auto all = list_checkpoints(output_dir);
  return all.empty() ? std::string() : all.back().string();
}

bool Trainer::stop_requested() const {
  const bool local = pending_stop_signal().load() != 0 || (stop_check_ && stop_check_());
  if (!comm_) return local;
  return comm_->host_max({local ? 1 : 0})[0] > 0;
}

int Trainer::rank() const {
  return comm_ ? comm_->rank() : plan_.env.rank;
}

int Trainer::world_size() const {
  return comm_ ? comm_->world_size() : plan_.env.world_size;
}

int64_t Trainer::optimizer_state_bytes() const {
  return stack_->optimizer().state_bytes();
}

const dist::DataParallel* Trainer::data_parallel() const {
  return stack_ ? stack_->data_parallel() : nullptr;
}

std::atomic<int>& Trainer::pending_signal() {
  return pending_stop_signal();
}

void Trainer::install_signal_handlers() {
  install_stop_signal_handlers();
}

Trainer::Trainer(PretrainConfig config) : Trainer(std::move(config), BatchSource()) {}

Trainer::Trainer(PretrainConfig config, BatchSource source)
    : config_(std::move(config)), state_(std::make_unique<State>()), source_(std::move(source)) {
  init();
}

Trainer::~Trainer() = default;

// ---- The loop ---------------------------------------------------------------------------------

TrainResult Trainer::train() {
  const ops::BackendScope kernels(config_.kernels);  // this trainer's kernels, on this thread only
  prepare_output_dir();
  Run run(*this);
  State& st = *state_;
  // HF's step intervals, a float below 1 being a share of the run's steps (pretrain_config.h).
  const int64_t log_every = resolve_steps(config_.logging_steps, plan_.steps.total_steps);
  const int64_t save_every = resolve_steps(config_.save_steps, plan_.steps.total_steps);
  while (st.global_step < plan_.steps.total_steps) {
    if (stop_requested()) {
      run.stop(fmt::format("at step {}", st.global_step));
      break;
    }
    const Run::StepStart start = run.mark_step_start();
    Run::StepBatches batches = run.draw_batches();
    if (batches.exhausted) {
      if (is_main()) {
        run.bar->clear();
        logger()->info(
            "kiln-pretrain: the host's batches ran out during step {} (dropped); saving a checkpoint at step {}",
            st.global_step + 1, st.global_step);
      }
      run.result.last_checkpoint = save_checkpoint(st.global_step);
      run.result.data_exhausted = true;
      break;
    }
    if (!run.train_step(batches)) {
      run.undo_step(start);
      run.stop(fmt::format("during step {} (its partial gradients are dropped)", st.global_step + 1));
      break;
    }
    const int64_t step = st.global_step;
    if (step % log_every == 0 || step == plan_.steps.total_steps) run.log_window(step);
    if (run.evals.every > 0 && step % run.evals.every == 0 && step != plan_.steps.total_steps &&
        !run.evaluate_at(step)) {
      run.stop(fmt::format("during the evaluation at step {} (the partial evaluation is dropped)", step));
      break;
    }
    if (save_every > 0 && step % save_every == 0 && step != plan_.steps.total_steps) {
      run.result.last_checkpoint = save_checkpoint(step);
    }
  }
  if (!run.result.interrupted && !run.result.data_exhausted) {
    if (st.window_steps > 0) run.log_window(st.global_step);
    if (run.evals.at_train_end && !run.evaluate_at(st.global_step)) {
      run.stop(
          fmt::format("during the final evaluation at step {} (the partial evaluation is dropped)", st.global_step));
    } else {
      run.result.last_checkpoint = save_checkpoint(st.global_step);
    }
  }
  return run.finish();
}

// ---- One train() call's parts -----------------------------------------------------------------

Trainer::Run::Run(Trainer& trainer) : t(trainer), st(*trainer.state_) {
  const PretrainConfig& c = t.config_;
  if (!st.peak) st.peak = cost::device_peak(t.device_, t.autocast_dtype_.value_or(at::kFloat));
  fopts = at::TensorOptions().device(t.device_).dtype(at::kFloat);
  reset_window();
  st.first_bad_step = at::full({}, -1.0, fopts);
  sched = schedule_of(c, t.plan_.steps.total_steps);
  bar.emplace(t.plan_.steps.total_steps, st.global_step, t.is_main() && t.progress_bar_ ? stderr : nullptr);
  t.model_->train();
  // This call's share, for the summary entry (HF's speed metrics and train_loss).
  train_start = std::chrono::steady_clock::now();
  start_step = st.global_step;
  if (t.is_main() && c.report_to_tensorboard()) {
    const std::string dir = c.logging_dir.empty() ? default_logging_dir(c.output_dir) : c.logging_dir;
    st.tensorboard = std::make_unique<EventWriter>(dir);
    logger()->info("kiln-pretrain: TensorBoard event file {}", st.tensorboard->path());
  }
}

Trainer::Run::StepStart Trainer::Run::mark_step_start() const {
  std::optional<data::LoaderState> position;
  if (t.loader_) position = t.loader_->state();
  if (t.stream_) position = t.stream_->state();
  return {position, cpu_rng_state()};
}

void Trainer::Run::undo_step(const StepStart& start) {
  if (start.loader && t.loader_) t.loader_->restore(*start.loader);
  if (start.loader && t.stream_) t.stream_->restore(*start.loader);  // the epoch's stream again, fast-forwarded
  set_cpu_rng_state(start.cpu_rng);
}

Trainer::Run::StepBatches Trainer::Run::draw_batches() {
  StepBatches b;
  if (t.stream_) {
    // HF's windows over an iterable train set (data::next_stream_step): a full window, after any
    // windows an epoch's end cut short, each normalised by its own num_items_in_batch. One process.
    data::StreamStep step = data::next_stream_step(*t.stream_, t.config_.gradient_accumulation_steps);
    for (size_t i = 0; i < step.batches.size(); ++i) {
      data::Batch& m = step.batches[i];
      b.tokens += m.input_ids.numel();
      b.micro.push_back({std::move(m.input_ids), std::move(m.labels), std::move(m.segment_ids)});
    }
    b.micro_targets = std::move(step.window_items);
    b.targets = b.micro_targets.back();  // the full window's (the step's normaliser when no window was cut)
    if (step.windows == 1) b.micro_targets.clear();
    return b;
  }
  int64_t window = t.config_.gradient_accumulation_steps;
  if (t.loader_) window = std::min(window, t.loader_->batches_per_epoch() - t.loader_->state().position);
  // LLaMA-Factory's datasets: transformers' num_items_in_batch (trainer.py, get_batch_samples);
  // kiln's own: the scored targets.
  return draw_window(
      [&]() -> std::optional<MicroBatch> {
        if (t.source_) {
          std::optional<MicroBatch> m = t.source_();
          if (m) check_host_batch(*m, t.model_->config().vocab_size);
          return m;
        }
        data::Batch m = t.loader_->next();
        return MicroBatch{std::move(m.input_ids), std::move(m.labels), std::move(m.segment_ids)};
      },
      window, t.plan_.data.ignored_label_id >= 0, t.comm_.get());
}

bool Trainer::Run::train_step(StepBatches& batches) {
  const PretrainConfig& c = t.config_;
  const double lr = step_learning_rate(c, sched, st.global_step);
  const StepResult r = t.stack_->step(batches.micro, batches.targets, lr,
                                      {.should_stop = [this] { return t.stop_requested(); }}, batches.micro_targets);
  if (r.interrupted) return false;
  last_lr = lr;
  st.window_tokens += batches.tokens;
  st.total_flos += st.flops.train() * static_cast<double>(batches.tokens);
  st.window_comm_seconds += r.comm_seconds;
  const at::Tensor& bad = r.bad;
  ++st.global_step;
  // Book-keeping on the device: a skipped step contributes no loss, and the first bad step is kept.
  // The logged loss of kiln's shard folders is the window's loss per target; of LLaMA-Factory's
  // datasets, HF's: the mean of the steps' losses (each normalised by its own num_items_in_batch).
  const bool per_step = t.plan_.data.ignored_label_id >= 0;
  const double weight = per_step ? 1.0 : static_cast<double>(batches.targets);
  // (A streamed step joining windows an epoch's end cut short: HF adds each window's loss.)
  const at::Tensor step_loss = r.objective.defined() ? r.objective
                               : per_step            ? r.loss_sum / static_cast<double>(batches.targets)
                                                     : r.loss_sum;
  st.window_loss_sum.add_(at::where(bad, at::zeros_like(step_loss), step_loss));
  st.window_good_targets.add_(bad.logical_not().to(at::kFloat) * weight);
  st.first_bad_step.copy_(at::where(bad.logical_and(st.first_bad_step < 0),
                                    at::full({}, static_cast<double>(st.global_step), fopts), st.first_bad_step));
  last_norm = r.norm;
  ++st.window_steps;
  bar->update(st.global_step);
  if (t.callbacks_.on_step) t.callbacks_.on_step(st.global_step);
  return true;
}

// When this call has completed no step (a stop during set-up or the first step), the state to
// resume from is the one it started from (the checkpoint it resumed, or a fresh start), so nothing
// is written: a preempted job's grace period is not spent saving what is already on disk.
void Trainer::Run::stop(const std::string& where) {
  const int sig = pending_stop_signal().exchange(0);
  const char* who = sig == 0 && t.comm_ ? "a stop request (of another rank)" : stop_signal_name(sig);
  result.interrupted = true;
  if (st.global_step == start_step) {
    if (t.is_main()) {
      bar->clear();
      logger()->info("kiln-pretrain: {} received {}; no step trained since the start (step {}), nothing to save{}", who,
                     where, st.global_step,
                     st.resumed_from.empty() ? "" : fmt::format(" (resume from {})", st.resumed_from));
    }
    result.last_checkpoint = st.resumed_from;
    return;
  }
  if (t.is_main()) {
    bar->clear();
    logger()->info("kiln-pretrain: {} received {}; saving a checkpoint at step {}", who, where, st.global_step);
  }
  result.last_checkpoint = t.save_checkpoint(st.global_step);
}

}  // namespace kiln::train
