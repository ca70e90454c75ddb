// The sweep runner. Each point builds a fresh model and optimizer so that one point's memory
// (and an out-of-memory failure) does not leak into the next; on the CPU the counting allocator
// is installed for the whole sweep and its peak is reset before every timed step, so a step's
// peak includes the parameters and AdamW state it starts with, as the CUDA allocator's does.
#include "kiln/profile/sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "kiln/common/component_scope.h"
#include "kiln/common/device.h"
#include "kiln/common/dtype_names.h"
#include "kiln/common/logger.h"
#include "kiln/common/nvtx.h"
#include "kiln/common/torch_internals.h"
#include "kiln/config/yaml.h"
#include "kiln/cost/cpu_peak.h"
#include "kiln/cost/flops.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/traffic.h"
#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/dist/env.h"
#include "kiln/model/llama.h"
#include "kiln/ops/dispatch.h"
#include "kiln/optim/schedule.h"
#include "kiln/profile/counters/counters.h"
#include "kiln/profile/counters/cpu_allocator.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/kernel_choices.h"
#include "kiln/train/run_description.h"
#include "kiln/train/run_plan.h"
#include "kiln/train/training_stack.h"

namespace kiln::profile {

std::vector<train::MicroBatch> synthetic_batches(const model::LlamaConfig& model, const SweepPoint& p, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);  // the model's init draws from `seed`
  std::vector<train::MicroBatch> out;
  for (int64_t i = 0; i < p.gradient_accumulation_steps; ++i) {
    const at::Tensor ids = at::randint(0, model.vocab_size, {p.batch_size, p.cutoff_len}, gen, at::kLong);
    out.push_back({ids, ids.clone(), at::Tensor()});
  }
  return out;
}

double ProfileRow::ratio() const {
  const double p = predicted.total();
  return p > 0 ? peak_allocated_bytes / p : 0.0;
}

std::string ProfileRow::speed() const {
  if (status != "ok" || seconds_per_step <= 0) return status;
  const double its = 1.0 / seconds_per_step;
  return its >= 1.0 ? fmt::format("{:.2f} it/s", its) : fmt::format("{:.2f} s/it", seconds_per_step);
}

cost::RunDescription point_run(const ProfileSettings& config, const model::LlamaConfig& model, const SweepPoint& point,
                               const train::RunTarget& target) {
  return train::describe_run(point_config(config, point), model, target);
}

namespace {

struct PointContext {
  const ProfileSettings& config;
  const model::LlamaConfig& model_config;
  at::Device device;
  CountingCpuAllocatorGuard* counter;                  // CPU only
  std::shared_ptr<const data::PackedDataset> dataset;  // one per cutoff_len, or null (synthetic)
  double peak_tflops;
  std::shared_ptr<dist::Comm> comm;  // data parallel, or null
  CounterSession* counters;          // --counters with a session that can count, or null
};

// `steps` more steps of the point under the Kineto profiler (CPU ops; CUDA kernels too on a GPU),
// saved as a Chrome trace. Written to a temp name and renamed, as every kiln output.
template <typename Step>
void write_trace(const PointContext& ctx, const SweepPoint& p, const Step& step) {
  namespace fs = std::filesystem;
  torch_internals::KinetoTrace trace(ctx.device.is_cuda());
  for (int64_t i = 0; i < ctx.config.steps; ++i) step();
  device::synchronize(ctx.device);
  fs::create_directories(ctx.config.trace_dir);
  const fs::path path =
      fs::path(ctx.config.trace_dir) / fmt::format("trace_cutoff_len{}_batch{}_gradient_accumulation_steps{}.json",
                                                   p.cutoff_len, p.batch_size, p.gradient_accumulation_steps);
  const fs::path tmp = path.string() + ".tmp";
  trace.save(tmp.string());
  fs::rename(tmp, path);
}

void measure_point(const PointContext& ctx, ProfileRow& row) {
  const SweepPoint& p = row.point;
  const train::PretrainConfig training = point_config(ctx.config, p);
  // The model is ready before the rest of the stack: the RSS baseline below is taken with it alone.
  model::LlamaForCausalLM model = train::fresh_model(ctx.model_config, ctx.device, training.seed);
  // RSS baseline: the model is ready, nothing of the step exists yet (device.h read_rss).
  std::optional<int64_t> rss_baseline;
  if (device::reset_rss_peak()) {
    if (const auto rss = device::read_rss()) rss_baseline = rss->current_bytes;
  }
  train::StackOptions options = train::stack_options(training, ctx.comm, static_cast<int>(training.zero_stage));
  options.parallel.overlap = ctx.config.ddp_overlap;
  train::TrainingStack stack(model, ctx.device, std::move(options));
  const dist::DataParallel* dp = stack.data_parallel();
  model->train();
  const optim::ScheduleConfig schedule = train::schedule_of(training, training.max_steps);
  int64_t step_index = 0;  // of the point's steps, for the schedule

  std::unique_ptr<data::DataLoader> loader;
  std::vector<train::MicroBatch> synthetic;
  if (ctx.dataset) {
    data::LoaderOptions lo;
    lo.batch_size = p.batch_size;
    lo.seed = training.seed;
    lo.prefetch = 0;
    if (ctx.comm) {
      lo.rank = ctx.comm->rank();
      lo.world_size = ctx.comm->world_size();
    }
    loader = std::make_unique<data::DataLoader>(ctx.dataset, lo);
  } else {
    synthetic = synthetic_batches(ctx.model_config, p, training.seed);
  }

  std::vector<std::pair<at::Tensor, int64_t>> losses;  // each step's loss sum (on the device) and targets
  // The trainer's step (train::TrainingStack::step). Under counters with phases, `mark` tells the
  // session where forward, backward and the optimizer begin.
  double comm_seconds = 0;
  std::function<void(const char*)> mark;
  auto step = [&] {
    if (mark) mark("forward");  // the batch's assembly and copy to the device count as forward
    size_t next = 0;            // of the synthetic batches
    train::StepWindow w = train::draw_window(
        [&]() -> std::optional<train::MicroBatch> {
          if (!loader) return synthetic[next++];
          data::Batch b = loader->next();
          return train::MicroBatch{std::move(b.input_ids), std::move(b.labels), std::move(b.segment_ids)};
        },
        p.gradient_accumulation_steps, false, ctx.comm.get());
    const int64_t targets = std::max<int64_t>(w.targets, 1);  // cutoff_len 1 has no target: a zero loss
    const train::StepResult r =
        stack.step(w.micro, targets, train::step_learning_rate(training, schedule, step_index++), {.mark = mark});
    comm_seconds += r.comm_seconds;
    losses.emplace_back(r.loss_sum, targets);
  };

  // Each phase's time on the log as it ends (stderr, flushed): a point that stalls shows where.
  const std::string where = "kiln-profile: " + point_label(p);
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  auto phase = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < ctx.config.warmup; ++i) step();
  device::synchronize(ctx.device);
  auto plural = [](int64_t n) { return n == 1 ? "" : "s"; };
  if (ctx.config.warmup > 0)
    kiln::logger()->info("{}: {} warmup step{} in {:.2f} s", where, ctx.config.warmup, plural(ctx.config.warmup),
                         since(phase));
  comm_seconds = 0;
  const dist::LaunchCounts launched_before = dp ? dp->launch_counts() : dist::LaunchCounts{};
  double seconds = 0, peak = 0;
  for (int64_t i = 0; i < ctx.config.steps; ++i) {
    if (ctx.counter) ctx.counter->reset_peak();
    device::reset_peak_memory(ctx.device);
    const auto t0 = std::chrono::steady_clock::now();
    step();
    device::synchronize(ctx.device);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    peak = std::max(peak, ctx.counter ? static_cast<double>(ctx.counter->stats().peak_bytes)
                                      : device::peak_memory_bytes(ctx.device));
  }
  const int world = ctx.comm ? ctx.comm->world_size() : 1;
  const double tokens = static_cast<double>(p.batch_size * p.gradient_accumulation_steps * p.cutoff_len * world);
  if (ctx.comm) {
    // The job's step takes as long as its slowest rank; memory is the largest rank's.
    const auto worst = ctx.comm->host_max({static_cast<int64_t>(seconds * 1e9), static_cast<int64_t>(peak)});
    seconds = static_cast<double>(worst[0]) / 1e9;
    peak = static_cast<double>(worst[1]);
    // Host waits measure exposed communication on the CPU (Gloo); NCCL's waits only order streams.
    if (ctx.device.is_cpu()) row.comm_wait_share = comm_seconds / seconds;
    row.buckets_launched = dp->launch_counts().buckets - launched_before.buckets;
    row.buckets_overlapped = dp->launch_counts().overlapped - launched_before.overlapped;
  }
  kiln::logger()->info("{}: {} timed step{} in {:.2f} s", where, ctx.config.steps, plural(ctx.config.steps), seconds);
  row.seconds_per_step = seconds / static_cast<double>(ctx.config.steps);
  row.tokens_per_second = tokens / row.seconds_per_step;
  row.tflops = cost::flops_per_token(ctx.model_config, p.cutoff_len).train() * row.tokens_per_second / world / 1e12;
  if (ctx.peak_tflops > 0) row.mfu = row.tflops / ctx.peak_tflops;
  row.peak_allocated_bytes = peak;
  row.peak_reserved_bytes = device::peak_reserved_bytes(ctx.device);
  if (const auto rss = device::read_rss(); rss && rss_baseline)
    row.rss_peak_over_baseline_bytes = static_cast<double>(rss->peak_bytes - *rss_baseline);
  if (ctx.counters) {
    // counter_steps more steps under the counters, untimed (per kernel, CUPTI serialises them).
    const int64_t counted = ctx.config.counted_steps();
    device::synchronize(ctx.device);
    kiln::logger()->info("{}: counting {} step{}{}", where, counted, plural(counted),
                         ctx.config.counters_per_kernel && ctx.device.is_cuda() ? " (one CUPTI range per kernel: slow)"
                         : ctx.config.counter_phases ? " (forward, backward and optimizer apart)"
                                                     : "");
    phase = std::chrono::steady_clock::now();
    ctx.counters->start();
    if (ctx.config.counter_phases) mark = [&](const char* name) { ctx.counters->phase(name); };
    for (int64_t i = 0; i < counted; ++i) step();
    device::synchronize(ctx.device);
    mark = nullptr;
    row.counters = ctx.counters->stop();
    const CounterReading& c = *row.counters;
    kiln::logger()->info("{}: counted in {:.2f} s{}", where, since(phase),
                         c.source == "cupti" ? fmt::format(" ({} CUPTI ranges, {:.2f} s of it reading them)", c.ranges,
                                                           c.collect_seconds)
                                             : "");
  }
  if (ctx.config.component_times) {
    // As many steps again under the profiler, untimed (its bookkeeping slows each op a little; on
    // a GPU the kernels' own times are what it reads).
    phase = std::chrono::steady_clock::now();
    torch_internals::OpEventRecorder recorder(ctx.device.is_cuda());
    for (int64_t i = 0; i < ctx.config.steps; ++i) step();
    device::synchronize(ctx.device);
    row.component_times = attribute_component_times(recorder.stop(), ctx.config.steps);
    const ComponentTimes& t = *row.component_times;
    kiln::logger()->info(
        "{}: {} step{} under the profiler in {:.2f} s{}", where, ctx.config.steps, plural(ctx.config.steps),
        since(phase),
        t.source == "gpu"
            ? fmt::format(" (GPU activities per step: {:g} linked to an op, {:g} placed by their launch's "
                          "time, {:g} unplaced)",
                          t.linked_activities, t.timed_activities, t.unplaced_activities)
            : "");
  }
  if (!ctx.config.trace_dir.empty()) write_trace(ctx, p, step);
  // Read once the point is done; divided as the trainer's log divides (in double).
  for (const auto& [sum, targets] : losses) row.losses.push_back(sum.item<double>() / static_cast<double>(targets));
}

// "1 step after each point's timed ones", "as many steps again after ...".
std::string counted_steps_text(const ProfileSettings& config) {
  if (config.counter_steps == 0) return "as many steps again after each point's timed ones";
  return fmt::format("{} step{} after each point's timed ones", config.counter_steps,
                     config.counter_steps == 1 ? "" : "s");
}

// The model's three columns at the measured step time, the components, and the counted columns.
void fill_utilisation(const SweepReport& report, const ProfileSettings& config, const train::RunTarget& target,
                      ProfileRow& row) {
  const cost::TrafficReport traffic =
      cost::traffic_model(report.model, point_run(config, report.model, row.point, target));
  row.executed_flops = traffic.kiln_step().flops();
  row.traffic_bytes = traffic.kiln_step().bytes;
  if (report.roofline) {
    row.components = component_rows(traffic, *report.roofline);
    // Per kernel on a GPU, the counters' bytes per row (counted over counted_steps steps).
    add_measurements(row.components, row.component_times, row.counters, config.counted_steps());
    row.modelled_step_seconds = cost::modelled_step_seconds(traffic, *report.roofline);
    const auto u = cost::modelled_utilisation(traffic, *report.roofline, row.seconds_per_step);
    row.memory_bandwidth.modelled = u.memory_bandwidth;
    row.tensor_core.modelled = u.tensor_core;
    row.fp_engine.modelled = u.fp_engine;
  }
  if (!config.counters) {
    for (Utilisation* u : {&row.memory_bandwidth, &row.tensor_core, &row.fp_engine})
      u->counted_reason = "not counted: run with --counters";
    return;
  }
  // Without a reading, the session's reason is already in the columns (run_sweep).
  if (row.counters) set_counted(row.memory_bandwidth, row.tensor_core, row.fp_engine, *row.counters);
}

}  // namespace

SweepReport run_sweep(const ProfileSettings& settings, const std::function<void(const ProfileRow&)>& on_row) {
  ProfileSettings config = settings;
  settle(config);
  SweepReport report;
  report.config = config;
  report.model = model::load_llama_config(config.run.model);
  // Where the points run: the trainer's rule (device, LOCAL_RANK's GPU, its dtype check, the
  // cutoff_len bound) at the grid's longest cutoff_len.
  const dist::DistEnv env = dist::read_dist_env();
  const SweepPoint longest{1, 1, *std::max_element(config.cutoff_len.begin(), config.cutoff_len.end())};
  const train::PlacedRun placed = train::run_target(point_config(config, longest), report.model, {.dist = env});
  const at::Device device = placed.device;
  train::RunTarget target = placed.target;
  if (device.is_cuda()) at::accelerator::setDeviceIndex(device.index());
  std::shared_ptr<dist::Comm> comm;
  if (env.distributed()) {
    comm = dist::connect(env, {.cuda_device = device.is_cuda() ? device.index() : -1});
    report.world_size = comm->world_size();
    report.launcher = env.launcher;
    report.backend = comm->backend();
  }
  const auto autocast = autocast_dtype(config.dtype);  // common/dtype_names.h
  {
    model::LlamaForCausalLM meta(report.model, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    report.num_parameters = meta->num_parameters();
  }
  report.device = device.str();
  // The roofline's device: a GPU's data-sheet row, or the CPU's theoretical peak (cpuid, the FMA
  // table, sysfs) and measured copy bandwidth, with the measured GEMM rate beside it.
  report.machine = cost::machine_hardware(device);
  if (device.is_cpu()) report.measured_gemm_tflops = device::measure_cpu_gemm_tflops();
  if (report.machine.cpu_peak) {
    if (const auto bug = cost::peak_violation(
            *report.measured_gemm_tflops / (report.machine.cpu_peak->fp32 / 1e12), "the measured fp32 GEMM rate",
            "the theoretical fp32 peak (" + report.machine.cpu_peak->formula() + ")")) {
      report.measured_gemm_exceeds_peak = true;
      report.warnings.push_back(*bug);
    }
  }
  if (config.peak_tflops > 0) {
    report.peak_name = "--peak-tflops";
    report.peak_tflops = config.peak_tflops;
    report.peak_source = "--peak-tflops";
    if (device.is_cuda()) report.device += " (" + device::name(device) + ")";
  } else if (report.machine.cpu_peak) {
    report.peak_name = device::name(device);
    report.peak_tflops = report.machine.cpu_peak->flops(config.dtype) / 1e12;
    report.peak_source = "theoretical";
  } else if (const auto peak = cost::device_peak(device, autocast.value_or(at::kFloat))) {
    report.peak_name = peak->name;
    report.peak_tflops = peak->tflops;
    report.peak_source = peak->source;
    if (device.is_cuda()) report.device += " (" + peak->name + ")";
  }
  if (report.machine.spec) {
    report.roofline = cost::roofline(*report.machine.spec, config.dtype);
    if (config.peak_tflops > 0) report.roofline->gemm_flops_per_s = config.peak_tflops * 1e12;
  }
  std::unique_ptr<CounterSession> counters;
  if (config.counters) {
    CounterOptions options{.per_kernel = config.counters_per_kernel, .phases = config.counter_phases};
    // Phase segments of one point's counted steps: a forward and a backward per micro-batch and an
    // optimizer per step, at the sweep's largest accumulation (CUPTI sizes its ranges by it).
    const int64_t max_accum =
        *std::max_element(config.gradient_accumulation_steps.begin(), config.gradient_accumulation_steps.end());
    options.max_phase_ranges = config.counted_steps() * (2 * max_accum + 1);
    counters = CounterSession::open(device, report.roofline ? report.roofline->bandwidth : 0.0, options);
    report.counters_note = counters->available() ? "counted: hardware counters over " + counted_steps_text(config)
                                                 : "counters unavailable: " + counters->reason();
    if (!counters->available()) counters.reset();
  } else {
    report.counters_note = "not counted (run with --counters): the columns show the traffic model's values";
  }

  // The run's kernels, for this thread only (the sweep may run inside a larger program).
  const ops::BackendScope backends(config.run.kernels);

  std::unique_ptr<CountingCpuAllocatorGuard> counter;
  if (device.is_cpu()) counter = std::make_unique<CountingCpuAllocatorGuard>(config.memory_cap_bytes);
  if (device.is_cuda() && config.memory_cap_bytes > 0) device::set_device_memory_cap(device, config.memory_cap_bytes);

  std::shared_ptr<data::TokenShards> shards;
  if (!config.run.dataset_dir.empty()) {
    // Checked once here: the step's loss head trusts its labels (ops::CheckedLabelsScope).
    shards = data::TokenShards::open(config.run.dataset_dir);
    shards->check_ids_below(report.model.vocab_size, fmt::format("the model's vocab_size ({})", config.run.model));
  }

  std::shared_ptr<const data::PackedDataset> dataset;  // the shards packed at the point's cutoff_len
  for (const SweepPoint& point : grid_points(config)) {
    if (shards && (!dataset || dataset->cutoff_len() != point.cutoff_len)) {
      dataset = std::make_shared<data::PackedDataset>(shards->split("train"), point.cutoff_len);
      if (dataset->num_blocks() == 0) {
        throw config::ConfigError(config::config_message(
            config.source, "cutoff_len",
            fmt::format("{} is longer than the whole train split of {}", point.cutoff_len, config.run.dataset_dir)));
      }
    }
    ProfileRow row;
    row.point = point;
    row.predicted = cost::estimate_training_memory(report.model, point_run(config, report.model, row.point, target));
    const PointContext ctx{config,  report.model,       device, counter.get(),
                           dataset, report.peak_tflops, comm,   counters.get()};
    try {
      measure_point(ctx, row);
    } catch (const c10::OutOfMemoryError& e) {
      row.status = "OOM";
      row.message = e.what_without_backtrace();
    } catch (const std::bad_alloc& e) {
      row.status = "OOM";
      row.message = e.what();
    } catch (const c10::Error& e) {
      row.status = "error";
      row.message = e.what_without_backtrace();
    } catch (const std::exception& e) {
      row.status = "error";
      row.message = e.what();
    }
    device::release_cached_memory(device);
    row.peak_rss_bytes = static_cast<double>(device::peak_rss_bytes());
    if (row.status == "ok") {
      fill_utilisation(report, config, target, row);
      if (config.counters && !counters) {
        for (Utilisation* u : {&row.memory_bandwidth, &row.tensor_core, &row.fp_engine})
          u->counted_reason = report.counters_note;
      }
      if (row.mfu) {
        const std::string what = "MFU at " + point_label(point);
        const std::string of =
            fmt::format("the {} peak of {:.4g} TFLOP/s ({})", config.dtype, report.peak_tflops, report.peak_source);
        if (const auto bug = cost::peak_violation(*row.mfu, what, of)) {
          row.mfu_exceeds_peak = true;
          report.warnings.push_back(*bug);
        }
      }
    }
    if (on_row) on_row(row);
    report.rows.push_back(std::move(row));
  }
  if (device.is_cuda() && config.memory_cap_bytes > 0) device::set_device_memory_cap(device, 0);
  if (counters) {
    // One line: what counted, and for each column no point counted, why (the first point's reason).
    std::string what, missing;
    const std::pair<const char*, Utilisation ProfileRow::*> columns[] = {
        {"memory bandwidth", &ProfileRow::memory_bandwidth},
        {"tensor core", &ProfileRow::tensor_core},
        {"fp engine", &ProfileRow::fp_engine}};
    for (const auto& [name, member] : columns) {
      bool counted = false;
      std::string reason;
      for (const ProfileRow& row : report.rows) {
        if (row.counters && what.empty())
          what = row.counters->detail.empty() ? row.counters->source : row.counters->detail;
        counted = counted || (row.*member).counted.has_value();
        if (reason.empty()) reason = (row.*member).counted_reason;
      }
      if (!counted && !reason.empty()) missing += fmt::format("; {}: {}", name, reason);
    }
    report.counters_note = fmt::format("counted ({}) over {}{}", what.empty() ? "no point ran" : what,
                                       counted_steps_text(config), missing);
  }
  if (comm) comm->shutdown();  // in order, now (docs/distributed.md, "Shutdown"); an error aborts in ~C10dComm
  return report;
}

}  // namespace kiln::profile
