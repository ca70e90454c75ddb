#include "kiln/cost/reference_runs.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "kiln/config/yaml.h"
#include "kiln/cost/memory.h"
#include "kiln/model/presets.h"

namespace kiln::cost {

namespace {

using config::ConfigError;

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
HostModel host_model(const Loaded& h, const std::string& stack, const std::string& dtype, double parameter_tensors) {
  const YAML::Node s = h.root[stack];
  if (!s) fail(h.source, stack, "missing");
  const std::string counted = dtype == "fp32" ? "fp32" : "bf16";  // fp16 launches bf16's ops (+ the scaler's)
  const std::string at = stack + ".ops." + counted + ".";
  const YAML::Node ops = s["ops"][counted];
  if (!ops) fail(h.source, stack + ".ops." + counted, "missing");
  HostModel m;
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
    const SmiMemory& m = r.predicted_memory;
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

ReferenceReport predict_reference_runs(const std::string& data_path, const std::string& host_costs_path,
                                       const KilnRunOf& kiln_run) {
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
      const auto hardware = hardware_spec(*device_name);
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
      // kiln's run of the same work on this GPU (the caller's description).
      const RunDescription kiln = kiln_run(r, model, *hardware);
      const RunDescription ref_run = reference_run(kiln);
      const Roofline roof = roofline(*hardware, r.dtype);

      // Both steps' GEMMs re-read their operands past this GPU's L2 (traffic.h, GemmDram).
      const GemmDram dram{hardware->l2_bytes, 128, 128, hardware->sms};
      const TrafficReport ref_traffic = traffic_model(model, ref_run, reference_eager_stack(), dram);
      // Parameter tensors: per layer two norms and seven projections, the embedding (tied: also the
      // head) and the final norm.
      const double tensors =
          9.0 * static_cast<double>(model.num_hidden_layers) + 2.0 + (model.tie_word_embeddings ? 0 : 1);
      HostModel ref_host = host_model(host, "transformers", r.dtype, tensors);
      ref_host.sync_per_micro_batch = true;
      r.predicted = step_time(ref_traffic, roof, ref_host, true);
      r.predicted_memory = reference_memory(model, ref_run);
      r.counters_at_measured = modelled_utilisation(ref_traffic, roof, *r.measured_seconds, true);
      r.attention_backend = reference_sdpa_backend(*hardware, r.dtype);
      for (const Pass pass : {Pass::kForward, Pass::kBackward, Pass::kRecompute, Pass::kStep}) {
        double bytes = 0;
        for (const TrafficRow& row : ref_traffic.rows) {
          if (row.pass == pass) bytes += row.eager_step().bytes;
        }
        r.bytes_by_pass.emplace_back(pass_name(pass), bytes);
      }
      r.gemm_flops = ref_traffic.eager_step().gemm_flops;

      const TrafficReport kiln_traffic = traffic_model(model, kiln, {}, dram);
      r.kiln = step_time(kiln_traffic, roof, host_model(host, "kiln", r.dtype, tensors), false);
      r.kiln_memory = kiln_memory(model, kiln);
      r.kiln_counters = modelled_utilisation(kiln_traffic, roof, r.kiln.seconds, false);
      r.kiln_attention = kiln.kernels.attention;
      explain_misses(r);
      report.rows.push_back(std::move(r));
    }
  }
  return report;
}

}  // namespace kiln::cost
