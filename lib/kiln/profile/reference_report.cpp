#include "kiln/profile/reference_report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "kiln/config/yaml.h"
#include "kiln/cost/hardware.h"
#include "kiln/model/llama_config.h"
#include "kiln/model/presets.h"
#include "kiln/profile/command_keys.h"
#include "kiln/profile/report.h"
#include "kiln/profile/report_internal.h"

namespace kiln::profile {

namespace {

using config::ConfigError;
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& key, const std::string& problem) {
  throw ConfigError(config::config_message(source, key, problem));
}

struct Loaded {
  YAML::Node root;
  std::string source;
};

// A path, or the copy of configs/reference/<stem>.yaml compiled into the library.
Loaded load(const std::string& path, const std::string& stem) {
  Loaded l;
  try {
    if (!path.empty()) {
      if (!std::filesystem::is_regular_file(path)) fail(path, "", "not a readable file");
      l.source = path;
      l.root = YAML::LoadFile(path);
      return l;
    }
    for (const auto& [name, text] : model::detail::embedded_reference_files()) {
      if (name == stem) {
        l.source = fmt::format("configs/reference/{}.yaml (compiled in)", stem);
        l.root = YAML::Load(std::string(text));
        return l;
      }
    }
  } catch (const YAML::Exception& e) {
    fail(path.empty() ? stem : path, "", std::string("not valid YAML: ") + e.what());
  }
  fail(stem, "", "no such file compiled into the library");
}

template <class T>
T need(const YAML::Node& node, const std::string& key, const std::string& source, const std::string& where) {
  const YAML::Node v = node[key];
  if (!v) fail(source, where + key, "missing");
  try {
    return v.as<T>();
  } catch (const YAML::Exception&) {
    fail(source, where + key,
         fmt::format("'{}' is not a {}", YAML::Dump(v),
                     std::is_same_v<T, std::string> ? "string"
                     : std::is_same_v<T, bool>      ? "boolean"
                                                    : "number"));
  }
}

// A mapping's keys must be among `known`: a misspelt key is an error, never a figure silently lost.
void only_keys(const YAML::Node& node, std::initializer_list<const char*> known, const std::string& source,
               const std::string& where) {
  if (!node.IsMap()) fail(source, where.empty() ? "" : where.substr(0, where.size() - 1), "not a mapping");
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) == known.end()) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      fail(source, where + key, "unknown key (known: " + list + ")");
    }
  }
}

template <class T>
std::optional<T> maybe(const YAML::Node& node, const std::string& key, const std::string& source,
                       const std::string& where) {
  if (!node[key] || node[key].IsNull()) return std::nullopt;
  return need<T>(node, key, source, where);
}

// The host costs of one stack for one dtype (configs/reference/host_costs.yaml).
cost::HostModel host_model(const Loaded& h, const std::string& stack, const std::string& dtype,
                           double parameter_tensors) {
  const YAML::Node s = h.root[stack];
  if (!s) fail(h.source, stack, "missing");
  const std::string counted = dtype == "fp32" ? "fp32" : "bf16";  // fp16 launches bf16's ops (+ the scaler's)
  const std::string at = stack + ".ops." + counted + ".";
  const YAML::Node ops = s["ops"][counted];
  if (!ops) fail(h.source, stack + ".ops." + counted, "missing");
  cost::HostModel m;
  for (const auto& [phase, fixed, per_layer] :
       {std::tuple{"forward", &m.ops.forward_fixed, &m.ops.forward_per_layer},
        std::tuple{"backward", &m.ops.backward_fixed, &m.ops.backward_per_layer}}) {
    if (!ops[phase]) fail(h.source, at + phase, "missing");
    *fixed = need<double>(ops[phase], "fixed", h.source, at + phase + ".");
    *per_layer = need<double>(ops[phase], "per_layer", h.source, at + phase + ".");
  }
  if (!ops["step"]) fail(h.source, at + "step", "missing");
  // Per optimizer step: fixed + per parameter tensor (clip_grad_norm_'s per-tensor norms, AdamW's
  // step counters; foreach kernels are one op per list).
  m.ops.step =
      need<double>(ops["step"], "fixed", h.source, at + "step.") +
      maybe<double>(ops["step"], "per_parameter_tensor", h.source, at + "step.").value_or(0) * parameter_tensors;
  // (ops.loss_tracking, the Trainer's per micro-batch loss bookkeeping, is inside the measured
  // trainer_seconds.per_micro_batch: not added again.)
  if (const YAML::Node g = s["ops"]["grad_scaler"]) {
    m.ops.scaler_per_micro_batch = need<double>(g, "per_micro_batch", h.source, stack + ".ops.grad_scaler.");
    m.ops.scaler_per_step = need<double>(g, "per_step", h.source, stack + ".ops.grad_scaler.");
  }
  m.seconds_per_op = need<double>(s, "seconds_per_op", h.source, stack + ".");
  if (const YAML::Node t = s["trainer_seconds"]) {
    m.fixed_per_micro_batch = need<double>(t, "per_micro_batch", h.source, stack + ".trainer_seconds.");
    m.fixed_per_step = need<double>(t, "per_step", h.source, stack + ".trainer_seconds.");
  }
  return m;
}

model::LlamaConfig reference_model(const std::string& name) {
  for (const auto& [stem, text] : model::detail::embedded_reference_files()) {
    if (stem == name)
      return model::parse_llama_config(std::string(text), fmt::format("configs/reference/{}.yaml", stem));
  }
  return model::load_llama_config(name);
}

// What the model leaves out, named for a figure outside its tolerance, from the prediction's own
// breakdown (never from the row's position in the table).
void explain_misses(ReferenceRow& r) {
  const double a = static_cast<double>(r.accumulation);
  if (const auto ratio = r.speed_ratio(); ratio && !r.speed_within()) {
    const double device = a * r.predicted.device_micro_batch + r.predicted.device_step;
    const double host = a * r.predicted.host_micro_batch + r.predicted.host_step;
    if (*ratio < 1) {
      r.misses.push_back(fmt::format(
          "speed: {:.0f} ms predicted against {:.0f} ms measured, {}-bound in the model (device {:.0f} ms, host {:.0f} "
          "ms): the device's time is every kernel at the roofline's peaks (the GEMMs and the {} attention at the "
          "tensor-core peak, the rest at the full DRAM bandwidth); the rates the kernels reach on this GPU are not "
          "in it (not measured: scripts/measure_gpu_constants.py measures SDPA's and a copy's on the next GPU); at the "
          "measured time the model's own counters read bandwidth {:.0f}%, tensor core {:.0f}%{}",
          1e3 * r.predicted.seconds, 1e3 * *r.measured_seconds, r.predicted.host_bound ? "host" : "device",
          1e3 * device, 1e3 * host, r.attention_backend, 100 * r.counters_at_measured.memory_bandwidth,
          100 * r.counters_at_measured.tensor_core,
          r.memory_bandwidth ? fmt::format(" (the run's profiler: bandwidth {:.0f}%)", 100 * *r.memory_bandwidth)
                             : std::string()));
    } else {
      r.misses.push_back(fmt::format("speed: {:.0f} ms predicted against {:.0f} ms measured: slower than the run",
                                     1e3 * r.predicted.seconds, 1e3 * *r.measured_seconds));
    }
  }
  if (const auto ratio = r.memory_ratio(); ratio && !r.memory_within()) {
    const cost::SmiMemory& m = r.predicted_memory;
    r.misses.push_back(fmt::format(
        "memory: {:.2f} GB predicted against {:.2f} GB measured: the replay's segments ({:.2f} GB, {:.2f} GB of them "
        "cached free blocks; last grown in {}) and PyTorch's measured context after initialisation ({:.2f} GB); {}",
        m.total() / 1e9, *r.measured_memory / 1e9, m.reserved / 1e9, m.cached_free() / 1e9, m.peak_phase,
        m.context / 1e9,
        *ratio < 1 ? "not in it: the kernels a training step loads lazily into the context, and the allocator's "
                     "behaviour below the replay's tensor granularity (autograd's and the kernels' temporaries)"
                   : "the replay's cached free blocks exceed what the run's allocator kept (the order of its "
                     "requests differs from the replay's)"));
  }
}

}  // namespace

double parse_speed_seconds(const std::string& text) {
  std::istringstream in(text);
  double value = 0;
  std::string unit;
  if (!(in >> value) || !(in >> unit) || !(value > 0)) {
    throw std::invalid_argument(fmt::format("speed '{}' is not '<number> it/s' or '<number> s/it'", text));
  }
  if (unit == "it/s") return 1.0 / value;
  if (unit == "s/it") return value;
  throw std::invalid_argument(fmt::format("speed '{}': unit '{}' is not it/s or s/it", text, unit));
}

std::optional<double> ReferenceRow::speed_ratio() const {
  if (!measured_seconds) return std::nullopt;
  return predicted.seconds / *measured_seconds;
}

std::optional<double> ReferenceRow::memory_ratio() const {
  if (!measured_memory) return std::nullopt;
  return predicted_memory.total() / *measured_memory;
}

bool ReferenceRow::speed_within() const {
  const auto r = speed_ratio();
  return !r || std::abs(*r - 1) <= kSpeedTolerance;
}

bool ReferenceRow::memory_within() const {
  const auto r = memory_ratio();
  return !r || std::abs(*r - 1) <= kMemoryTolerance;
}

ReferenceReport reference_report(const std::string& data_path, const std::string& host_costs_path) {
  const Loaded data = load(data_path, "llamafactory_runs");
  const Loaded host = load(host_costs_path, "host_costs");
  ReferenceReport report;
  report.data_source = data.source;
  report.host_source = host.source;
  const YAML::Node tables = data.root["tables"];
  if (!tables || !tables.IsSequence()) fail(data.source, "tables", "missing or not a list");
  for (size_t ti = 0; ti < tables.size(); ++ti) {
    const YAML::Node t = tables[ti];
    const std::string where = fmt::format("tables[{}].", ti);
    only_keys(t, {"name", "gpu", "device", "model", "fp16", "bf16", "num_gpu", "rows", "notes"}, data.source, where);
    const std::string name = need<std::string>(t, "name", data.source, where);
    const std::string model_name = need<std::string>(t, "model", data.source, where);
    const int64_t gpus = maybe<int64_t>(t, "num_gpu", data.source, where).value_or(1);
    const YAML::Node rows = t["rows"];
    if (!rows || !rows.IsSequence()) fail(data.source, where + "rows", "missing or not a list");
    const auto device_name = maybe<std::string>(t, "device", data.source, where);
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const YAML::Node row = rows[ri];
      const std::string at = fmt::format("{}rows[{}].", where, ri);
      // tflops: the user's own estimate of the achieved rate, kept as written (not a measurement).
      only_keys(row,
                {"speed", "batch", "accumulation", "cutoff_len", "memory_gb", "memory_bandwidth", "tensor_core",
                 "fp_engine", "fp32_engine", "tflops"},
                data.source, at);
      const auto speed = maybe<std::string>(row, "speed", data.source, at);
      if (!speed || gpus != 1) {
        report.unmeasured.push_back(fmt::format("{}: batch {}, cutoff_len {} ({} GPUs): {}", name,
                                                need<int64_t>(row, "batch", data.source, at),
                                                need<int64_t>(row, "cutoff_len", data.source, at), gpus,
                                                speed ? "multi-GPU rows are not modelled" : "no measured figures"));
        continue;
      }
      if (!device_name) fail(data.source, where + "device", "missing: the hardware table's name of the GPU");
      const auto hardware = cost::hardware_spec(*device_name);
      if (!hardware)
        fail(data.source, where + "device", fmt::format("'{}' is not in the hardware table", *device_name));
      ReferenceRow r;
      r.table = name;
      r.device = *device_name;
      r.model = model_name;
      const bool fp16 = maybe<bool>(t, "fp16", data.source, where).value_or(false);
      const bool bf16 = maybe<bool>(t, "bf16", data.source, where).value_or(false);
      if (fp16 && bf16) fail(data.source, where + "bf16", "fp16 and bf16 are both true: a run has one of them");
      r.dtype = fp16 ? "fp16" : bf16 ? "bf16" : "fp32";
      r.batch = need<int64_t>(row, "batch", data.source, at);
      r.accumulation = need<int64_t>(row, "accumulation", data.source, at);
      r.cutoff_len = need<int64_t>(row, "cutoff_len", data.source, at);
      r.speed_text = *speed;
      try {
        r.measured_seconds = parse_speed_seconds(*speed);
      } catch (const std::invalid_argument& e) {
        fail(data.source, at + "speed", e.what());
      }
      // nvidia-smi prints MiB; the notes write 2579 MiB as "2.579" GB.
      if (const auto gb = maybe<double>(row, "memory_gb", data.source, at))
        r.measured_memory = *gb * 1000.0 * 1048576.0;
      r.memory_bandwidth = maybe<double>(row, "memory_bandwidth", data.source, at);
      r.tensor_core = maybe<double>(row, "tensor_core", data.source, at);
      r.fp_engine = maybe<double>(row, "fp_engine", data.source, at);
      if (!r.fp_engine) r.fp_engine = maybe<double>(row, "fp32_engine", data.source, at);

      const model::LlamaConfig model = reference_model(model_name);
      // kiln's run: described as kiln-profile explain describes one (kiln-pretrain's keys for the
      // same work, its defaults otherwise) on this hardware row.
      ExplainSettings es;
      es.source = data.source;
      es.model = model_name;
      es.cutoff_len = r.cutoff_len;
      es.per_device_train_batch_size = r.batch;
      es.gradient_accumulation_steps = r.accumulation;
      es.dtype = r.dtype;
      const cost::RunDescription kiln_run = explain_run(es, model, ExplainDevice{true, *hardware, hardware->source});
      const cost::RunDescription ref_run = cost::reference_run(kiln_run);
      const cost::Roofline roof = cost::roofline(*hardware, r.dtype);

      // Both steps' GEMMs re-read their operands past this GPU's L2 (traffic.h, GemmDram).
      const cost::GemmDram dram{hardware->l2_bytes, 128, 128, hardware->sms};
      const cost::TrafficReport ref_traffic = cost::traffic_model(model, ref_run, cost::reference_eager_stack(), dram);
      // Parameter tensors: per layer two norms and seven projections, the embedding (tied: also the
      // head) and the final norm.
      const double tensors =
          9.0 * static_cast<double>(model.num_hidden_layers) + 2.0 + (model.tie_word_embeddings ? 0 : 1);
      cost::HostModel ref_host = host_model(host, "transformers", r.dtype, tensors);
      ref_host.sync_per_micro_batch = true;
      r.predicted = cost::step_time(ref_traffic, roof, ref_host, true);
      r.predicted_memory = cost::reference_memory(model, ref_run);
      r.counters_at_measured = cost::modelled_utilisation(ref_traffic, roof, *r.measured_seconds, true);
      r.attention_backend = cost::reference_sdpa_backend(*hardware, r.dtype);
      for (const cost::Pass pass :
           {cost::Pass::kForward, cost::Pass::kBackward, cost::Pass::kRecompute, cost::Pass::kStep}) {
        double bytes = 0;
        for (const cost::TrafficRow& row : ref_traffic.rows) {
          if (row.pass == pass) bytes += row.eager_step().bytes;
        }
        r.bytes_by_pass.emplace_back(cost::pass_name(pass), bytes);
      }
      r.gemm_flops = ref_traffic.eager_step().gemm_flops;

      const cost::TrafficReport kiln_traffic = cost::traffic_model(model, kiln_run, {}, dram);
      r.kiln = cost::step_time(kiln_traffic, roof, host_model(host, "kiln", r.dtype, tensors), false);
      r.kiln_memory = cost::kiln_memory(model, kiln_run);
      r.kiln_counters = cost::modelled_utilisation(kiln_traffic, roof, r.kiln.seconds, false);
      r.kiln_attention = kiln_run.kernels.attention;
      explain_misses(r);
      report.rows.push_back(std::move(r));
    }
  }
  return report;
}

namespace {

std::string shape(const ReferenceRow& r) {
  return fmt::format("{} x {} x {}", r.cutoff_len, r.batch, r.accumulation);
}

std::string pct(const std::optional<double>& f) {
  return f ? fmt::format("{:.0f}%", 100 * *f) : "";
}

std::string gb(double bytes) {
  return fmt::format("{:.2f}", bytes / 1e9);
}

}  // namespace

std::string reference_markdown(const ReferenceReport& rep) {
  std::string out = fmt::format(
      "# kiln reference: the reference runs, predicted\n\n"
      "Measured: {}. Host costs: {}. The reference stack: LLaMA-Factory 0.9.0 on transformers 4.45 (SDPA attention, "
      "gradient checkpointing, fp32 logits, foreach AdamW), its step the larger of host and device time between "
      "synchronisations; memory as nvidia-smi shows it (the caching allocator's segments, replayed tensor by tensor, "
      "and the CUDA context). "
      "kiln: its own step for the same work on the same GPU (default kernels, no recomputation). Speed within {:.0f}% "
      "and memory within {:.0f}% are the targets; a row outside says what the model lacks.\n\n",
      rep.data_source, rep.host_source, 100 * kSpeedTolerance, 100 * kMemoryTolerance);
  out +=
      "| table | cutoff_len x batch x accumulation | measured s/step | predicted s/step | ratio | bound | measured GB "
      "| "
      "predicted GB | ratio | peak | kiln s/step | kiln GB | kiln speed-up |\n"
      "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n";
  for (const ReferenceRow& r : rep.rows) {
    out += fmt::format(
        "| {} | {} | {:.4g} ({}) | {:.4g} | {:.2f}{} | {} | {} | {} | {} | {} | {:.4g} | {} | {:.2f}x |\n", r.table,
        shape(r), *r.measured_seconds, r.speed_text, r.predicted.seconds, *r.speed_ratio(),
        r.speed_within() ? "" : " *", r.predicted.host_bound ? "host" : "device",
        r.measured_memory ? gb(*r.measured_memory) : "", gb(r.predicted_memory.total()),
        r.memory_ratio() ? fmt::format("{:.2f}{}", *r.memory_ratio(), r.memory_within() ? "" : " *") : "",
        r.predicted_memory.peak_phase, r.kiln.seconds, gb(r.kiln_memory.total()), r.predicted.seconds / r.kiln.seconds);
  }
  int speed_in = 0, speed_n = 0, mem_in = 0, mem_n = 0;
  for (const ReferenceRow& r : rep.rows) {
    speed_n += r.measured_seconds ? 1 : 0, speed_in += r.measured_seconds && r.speed_within() ? 1 : 0;
    mem_n += r.measured_memory ? 1 : 0, mem_in += r.measured_memory && r.memory_within() ? 1 : 0;
  }
  out += fmt::format("\nWithin tolerance: speed {} of {} rows, memory {} of {} rows (* outside).\n", speed_in, speed_n,
                     mem_in, mem_n);
  out +=
      "\n## Step time, host and device\n\n| table | cutoff_len x batch x accumulation | ops per step | host ms per "
      "micro-batch | device ms per micro-batch | host ms per step (optimizer) | device ms per step (optimizer) | "
      "attention | kiln: host ms | kiln: device ms |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | "
      "---: |\n";
  for (const ReferenceRow& r : rep.rows) {
    const double a = static_cast<double>(r.accumulation);
    out += fmt::format("| {} | {} | {:.0f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {} | {:.1f} | {:.1f} |\n", r.table,
                       shape(r), r.predicted.ops_per_step, 1e3 * r.predicted.host_micro_batch,
                       1e3 * r.predicted.device_micro_batch, 1e3 * r.predicted.host_step, 1e3 * r.predicted.device_step,
                       r.attention_backend, 1e3 * (a * r.kiln.host_micro_batch + r.kiln.host_step),
                       1e3 * (a * r.kiln.device_micro_batch + r.kiln.device_step));
  }
  out +=
      "\n## Counters: the user's profiler against the model at the measured step time\n\n| table | cutoff_len x batch "
      "x accumulation | memory bandwidth | tensor core | fp engine | kiln at its predicted time: bandwidth | tensor "
      "core | fp engine |\n| --- | --- | --- | --- | --- | ---: | ---: | ---: |\n";
  for (const ReferenceRow& r : rep.rows) {
    auto pair = [](const std::optional<double>& measured, double modelled) {
      return measured ? fmt::format("{} / {:.1f}%", pct(measured), 100 * modelled)
                      : fmt::format("- / {:.1f}%", 100 * modelled);
    };
    out += fmt::format("| {} | {} | {} | {} | {} | {:.1f}% | {:.1f}% | {:.1f}% |\n", r.table, shape(r),
                       pair(r.memory_bandwidth, r.counters_at_measured.memory_bandwidth),
                       pair(r.tensor_core, r.counters_at_measured.tensor_core),
                       pair(r.fp_engine, r.counters_at_measured.fp_engine), 100 * r.kiln_counters.memory_bandwidth,
                       100 * r.kiln_counters.tensor_core, 100 * r.kiln_counters.fp_engine);
  }
  out += "\n(measured / modelled; a blank measured cell: the user recorded none.)\n";
  out +=
      "\n## The reference step's modelled traffic, GB per optimizer step\n\n| table | cutoff_len x batch x "
      "accumulation | forward | backward | recompute | optimizer step | total | MB per token |\n| --- | --- | ---: | "
      "---: | ---: | ---: | ---: | ---: |\n";
  for (const ReferenceRow& r : rep.rows) {
    double total = 0;
    std::string cells;
    for (const auto& [pass, bytes] : r.bytes_by_pass) total += bytes, cells += fmt::format(" {:.2f} |", bytes / 1e9);
    const double tokens = static_cast<double>(r.cutoff_len * r.batch * r.accumulation);
    out +=
        fmt::format("| {} | {} |{} {:.2f} | {:.2f} |\n", r.table, shape(r), cells, total / 1e9, total / tokens / 1e6);
  }
  bool any = false;
  for (const ReferenceRow& r : rep.rows) {
    for (const std::string& m : r.misses) {
      if (!any) out += "\n## Outside the tolerance, and why\n\n";
      any = true;
      out += fmt::format("- {} {}: {}\n", r.table, shape(r), m);
    }
  }
  if (!rep.unmeasured.empty()) {
    out += "\n## Not predicted\n\n";
    for (const std::string& u : rep.unmeasured) out += "- " + u + "\n";
  }
  return out;
}

std::string reference_json(const ReferenceReport& rep) {
  json rows = json::array();
  auto step = [](const cost::StepTime& s) {
    return json{{"seconds", s.seconds},
                {"host_bound", s.host_bound},
                {"ops_per_step", s.ops_per_step},
                {"host_micro_batch_seconds", s.host_micro_batch},
                {"device_micro_batch_seconds", s.device_micro_batch},
                {"host_step_seconds", s.host_step},
                {"device_step_seconds", s.device_step}};
  };
  auto memory = [](const cost::SmiMemory& m) {
    json parts = json::array();
    for (const auto& [name, bytes] : m.components) parts.push_back({{"name", name}, {"bytes", bytes}});
    return json{{"bytes", m.total()},         {"allocated_bytes", m.allocated}, {"reserved_bytes", m.reserved},
                {"context_bytes", m.context}, {"peak_phase", m.peak_phase},     {"components", parts}};
  };
  auto counters = [](const cost::ModelledUtilisation& u) {
    return json{{"memory_bandwidth", u.memory_bandwidth}, {"tensor_core", u.tensor_core}, {"fp_engine", u.fp_engine}};
  };
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  for (const ReferenceRow& r : rep.rows) {
    rows.push_back({{"table", r.table},
                    {"device", r.device},
                    {"model", r.model},
                    {"dtype", r.dtype},
                    {"batch", r.batch},
                    {"accumulation", r.accumulation},
                    {"cutoff_len", r.cutoff_len},
                    {"measured",
                     {{"speed", r.speed_text},
                      {"seconds", opt(r.measured_seconds)},
                      {"memory_bytes", opt(r.measured_memory)},
                      {"memory_bandwidth", opt(r.memory_bandwidth)},
                      {"tensor_core", opt(r.tensor_core)},
                      {"fp_engine", opt(r.fp_engine)}}},
                    {"reference",
                     {{"step", step(r.predicted)},
                      {"memory", memory(r.predicted_memory)},
                      {"counters_at_measured_seconds", counters(r.counters_at_measured)},
                      {"attention_backend", r.attention_backend},
                      {"bytes_by_pass",
                       [&] {
                         json b = json::object();
                         for (const auto& [pass, bytes] : r.bytes_by_pass) b[pass] = bytes;
                         return b;
                       }()},
                      {"gemm_flops", r.gemm_flops},
                      {"speed_ratio", opt(r.speed_ratio())},
                      {"memory_ratio", opt(r.memory_ratio())},
                      {"speed_within", r.speed_within()},
                      {"memory_within", r.memory_within()},
                      {"misses", r.misses}}},
                    {"kiln",
                     {{"step", step(r.kiln)},
                      {"memory", memory(r.kiln_memory)},
                      {"counters", counters(r.kiln_counters)},
                      {"attention", r.kiln_attention}}}});
  }
  json out{{"data_source", rep.data_source},
           {"host_costs_source", rep.host_source},
           {"speed_tolerance", kSpeedTolerance},
           {"memory_tolerance", kMemoryTolerance},
           {"rows", rows},
           {"not_predicted", rep.unmeasured}};
  return out.dump(2) + "\n";
}

std::string reference_html(const ReferenceReport& rep) {
  using report_detail::html_escape;
  using report_detail::line_chart;
  using report_detail::Series;
  std::string out =
      "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kiln reference</title><style>"
      "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px "
      "8px;text-align:right}td.l{text-align:left}tr.miss td.r{background:#fdd}.chart text{font-family:sans-serif;"
      "font-size:11px}.chart .title{font-size:14px;font-weight:bold}</style></head><body>\n"
      "<h1>The reference runs, predicted</h1>\n";
  out += "<p>" + html_escape(fmt::format("Measured: {}. Host costs: {}.", rep.data_source, rep.host_source)) + "</p>\n";
  // Per table whose rows vary cutoff_len at batch 1, accumulation 1: step time and memory against it.
  std::map<std::string, std::vector<const ReferenceRow*>> sweeps;
  for (const ReferenceRow& r : rep.rows) {
    if (r.batch == 1 && r.accumulation == 1) sweeps[r.table].push_back(&r);
  }
  int id = 0;
  for (const auto& [table, rows] : sweeps) {
    if (rows.size() < 3) continue;
    Series ms{"measured", {}, report_detail::kColors[0]},
        pred{"reference, predicted", {}, report_detail::kColors[1], true},
        kiln{"kiln, predicted", {}, report_detail::kColors[2], true};
    Series gbm{"measured", {}, report_detail::kColors[0]},
        gbp{"reference, predicted", {}, report_detail::kColors[1], true},
        gbk{"kiln, predicted", {}, report_detail::kColors[2], true};
    for (const ReferenceRow* r : rows) {
      const double x = static_cast<double>(r->cutoff_len);
      ms.points.emplace_back(x, 1e3 * *r->measured_seconds);
      pred.points.emplace_back(x, 1e3 * r->predicted.seconds);
      kiln.points.emplace_back(x, 1e3 * r->kiln.seconds);
      if (r->measured_memory) gbm.points.emplace_back(x, *r->measured_memory / 1e9);
      gbp.points.emplace_back(x, r->predicted_memory.total() / 1e9);
      gbk.points.emplace_back(x, r->kiln_memory.total() / 1e9);
    }
    out += "<h2>" + html_escape(table) + "</h2>\n";
    out += line_chart(fmt::format("chart-ref-{}", id++), "step time, batch 1", "cutoff_len", "ms per step",
                      {ms, pred, kiln});
    out += line_chart(fmt::format("chart-ref-{}", id++), "memory (nvidia-smi)", "cutoff_len", "GB", {gbm, gbp, gbk});
  }
  out +=
      "<h2>Every row</h2>\n<table><tr><th>table</th><th>cutoff_len x batch x accumulation</th><th>measured s/step</th>"
      "<th>predicted</th><th>ratio</th><th>bound</th><th>measured GB</th><th>predicted GB</th><th>ratio</th><th>kiln "
      "s/step</th><th>kiln GB</th><th>why outside</th></tr>\n";
  for (const ReferenceRow& r : rep.rows) {
    std::string why;
    for (const std::string& m : r.misses) why += (why.empty() ? "" : "; ") + m;
    out += fmt::format(
        "<tr class=\"{}\"><td class=\"l\">{}</td><td>{}</td><td>{:.4g}</td><td>{:.4g}</td><td class=\"r\">{:.2f}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td class=\"r\">{}</td><td>{:.4g}</td><td>{}</td><td "
        "class=\"l\">{}</td></tr>\n",
        r.misses.empty() ? "" : "miss", html_escape(r.table), shape(r), *r.measured_seconds, r.predicted.seconds,
        *r.speed_ratio(), r.predicted.host_bound ? "host" : "device", r.measured_memory ? gb(*r.measured_memory) : "",
        gb(r.predicted_memory.total()), r.memory_ratio() ? fmt::format("{:.2f}", *r.memory_ratio()) : "",
        r.kiln.seconds, gb(r.kiln_memory.total()), html_escape(why));
  }
  out += "</table>\n</body></html>\n";
  return out;
}

std::vector<std::string> write_reference_reports(const ReferenceReport& report, const std::string& dir,
                                                 const std::vector<std::string>& formats) {
  for (const std::string& f : formats) {
    if (f == "csv") throw std::invalid_argument("kiln-profile reference writes md, json and html (not csv)");
  }
  return write_report_files(dir, "reference", formats, [&](const std::string& f) {
    return f == "md" ? reference_markdown(report) : f == "json" ? reference_json(report) : reference_html(report);
  });
}

}  // namespace kiln::profile
