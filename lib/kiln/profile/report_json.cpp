// The sweep's JSON report and kiln-profile explain's JSON.
#include "kiln/profile/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/cost/flops.h"
#include "kiln/profile/report_internal.h"

namespace kiln::profile {

using json = nlohmann::json;

namespace report_detail {

json components_json(const std::vector<ComponentRow>& rows) {
  json out = json::array();
  for (const ComponentRow& c : rows) {
    out.push_back({{"component", c.component},
                   {"pass", c.pass},
                   {"repeats", c.repeats},
                   {"gemm_flops", c.gemm_flops},
                   {"other_flops", c.other_flops},
                   {"bytes", c.bytes},
                   {"eager_bytes", c.eager_bytes},
                   {"intensity", c.intensity},
                   {"bound", c.bound},
                   {"modelled_seconds", c.modelled_seconds},
                   {"measured_seconds", c.measured_seconds ? json(*c.measured_seconds) : json(nullptr)},
                   {"counted_bytes", c.counted_bytes ? json(*c.counted_bytes) : json(nullptr)}});
  }
  return out;
}

json roofline_json(const cost::Roofline& r, const std::string& bandwidth_source) {
  return {
      {"device", r.device},       {"gemm_flops_per_s", r.gemm_flops_per_s}, {"other_flops_per_s", r.other_flops_per_s},
      {"bandwidth", r.bandwidth}, {"bandwidth_source", bandwidth_source},   {"tensor_cores", r.tensor_cores},
      {"ridge", r.ridge()}};
}

}  // namespace report_detail

using namespace report_detail;

std::string explain_json(const std::string& model_name, const cost::TrafficReport& traffic, const cost::Roofline& roof,
                         const std::string& bandwidth_source) {
  const cost::RunDescription& o = traffic.run;
  const cost::Cost k = traffic.kiln_step(), e = traffic.eager_step();
  const json doc = {{"model", model_name},
                    {"num_parameters", traffic.num_parameters},
                    {"cutoff_len", o.seq_len},
                    {"batch_size", o.batch},
                    {"gradient_accumulation_steps", o.grad_accum},
                    {"dtype", o.dtype},
                    {"attention", o.kernels.attention},
                    {"recompute", o.recompute},
                    {"tokens_per_step", traffic.tokens_per_step},
                    {"roofline", roofline_json(roof, bandwidth_source)},
                    {"components", components_json(component_rows(traffic, roof))},
                    // The fused loss head's fp32 weight-gradient sum (its bytes are in the head's row).
                    {"loss_head_accumulator",
                     {{"chunk_tokens", traffic.loss_head_accumulator.chunk_tokens},
                      {"chunks", traffic.loss_head_accumulator.chunks},
                      {"bytes_per_chunk", traffic.loss_head_accumulator.bytes_per_chunk},
                      {"bytes_per_step", traffic.loss_head_accumulator.bytes * static_cast<double>(o.grad_accum)}}},
                    {"totals",
                     {{"gemm_flops", k.gemm_flops},
                      {"other_flops", k.other_flops},
                      {"model_flops", traffic.model_flops_step()},
                      {"bytes", k.bytes},
                      {"eager_bytes", e.bytes},
                      {"modelled_seconds", cost::modelled_step_seconds(traffic, roof)},
                      {"eager_modelled_seconds", cost::modelled_step_seconds(traffic, roof, true)}}}};
  return doc.dump(2) + "\n";
}

std::string to_json(const SweepReport& report) {
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  json rows = json::array();
  for (const auto& r : report.rows) {
    json comps = json::object();
    for (const auto& [n, b] : r.predicted.components) comps[n] = b;
    const auto f = cost::flops_per_token(report.model, r.point.cutoff_len);
    rows.push_back({{"cutoff_len", r.point.cutoff_len},
                    {"batch_size", r.point.batch_size},
                    {"gradient_accumulation_steps", r.point.grad_accum},
                    {"status", r.status},
                    {"message", r.message},
                    {"speed", r.speed()},
                    {"seconds_per_step", ok(r) ? json(r.seconds_per_step) : json(nullptr)},
                    {"tokens_per_second", ok(r) ? json(r.tokens_per_second) : json(nullptr)},
                    {"tflops", ok(r) ? json(r.tflops) : json(nullptr)},
                    {"mfu", ok(r) ? opt(r.mfu) : json(nullptr)},
                    {"peak_allocated_bytes", ok(r) ? json(r.peak_allocated_bytes) : json(nullptr)},
                    {"peak_reserved_bytes", ok(r) ? opt(r.peak_reserved_bytes) : json(nullptr)},
                    {"peak_rss_bytes", r.peak_rss_bytes},
                    {"rss_peak_over_baseline_bytes", ok(r) ? opt(r.rss_peak_over_baseline_bytes) : json(nullptr)},
                    {"predicted_bytes", r.predicted.total()},
                    {"predicted_components", comps},
                    {"measured_over_predicted", ok(r) ? json(r.ratio()) : json(nullptr)},
                    {"flops_per_token",
                     {{"matmul_forward", f.matmul_forward},
                      {"attention_forward", f.attention_forward},
                      {"train", f.train()},
                      {"six_n", cost::six_n_per_token(report.model)}}},
                    {"comm_wait_share", opt(r.comm_wait_share)},
                    {"buckets_launched", r.buckets_launched ? json(*r.buckets_launched) : json(nullptr)},
                    {"buckets_overlapped", r.buckets_overlapped ? json(*r.buckets_overlapped) : json(nullptr)},
                    {"mfu_exceeds_peak", r.mfu_exceeds_peak},
                    {"losses", r.losses}});
    json& row = rows.back();
    const std::pair<std::string, const Utilisation*> columns[] = {
        {"memory_bandwidth", &r.memory_bandwidth}, {"tensor_core", &r.tensor_core}, {"fp_engine", &r.fp_engine}};
    for (const auto& [name, u] : columns) {
      row[name + "_modelled"] = opt(u->modelled);
      row[name + "_counted"] = opt(u->counted);
      row[name + "_counted_reason"] = u->counted ? json(nullptr) : json(u->counted_reason);
    }
    row["modelled_step_seconds"] = r.components.empty() ? json(nullptr) : json(r.modelled_step_seconds);
    row["executed_flops_per_step"] = ok(r) ? json(r.executed_flops) : json(nullptr);
    row["traffic_bytes_per_step"] = ok(r) ? json(r.traffic_bytes) : json(nullptr);
    row["components"] = components_json(r.components);
    if (r.component_times) {
      json merged = json::array();
      for (const auto& [component, pass, seconds] : unmatched_component_times(r))
        merged.push_back({{"component", component}, {"pass", pass}, {"measured_seconds", seconds}});
      row["component_times"] = {{"source", r.component_times->source},
                                {"linked_activities", r.component_times->linked_activities},
                                {"timed_activities", r.component_times->timed_activities},
                                {"unplaced_activities", r.component_times->unplaced_activities},
                                {"profiled_seconds", r.component_times->profiled_seconds},
                                {"unattributed_seconds", r.component_times->unattributed_seconds},
                                {"merged_rows", merged}};
    } else {
      row["component_times"] = nullptr;
    }
    if (r.counters) {
      const CounterReading& c = *r.counters;
      json per_range = json::array();
      for (const auto& [name, seconds] : c.per_range) per_range.push_back({name, seconds});
      row["counters"] = {{"source", c.source},
                         {"memory_bandwidth", opt(c.memory_bandwidth)},
                         {"tensor_core", opt(c.tensor_core)},
                         {"fp_engine", opt(c.fp_engine)},
                         {"dram_bytes", opt(c.dram_bytes)},
                         {"cycles", opt(c.cycles)},
                         {"instructions", opt(c.instructions)},
                         {"cpu_seconds", opt(c.cpu_seconds)},
                         {"memory_throughput", opt(c.memory_throughput)},
                         {"gpu_seconds", opt(c.gpu_seconds)},
                         {"ranges", c.ranges},
                         {"collect_seconds", c.collect_seconds},
                         {"seconds", c.seconds},
                         {"reason", c.reason},
                         {"detail", c.detail},
                         {"per_range", per_range}};
      auto kernel_json = [&](const KernelCounters& k) {
        json j = {{"name", k.name},
                  {"launches", k.launches},
                  {"seconds", k.seconds},
                  {"dram_bytes", opt(k.dram_bytes)},
                  {"memory_bandwidth", opt(k.memory_bandwidth)},
                  {"memory_throughput", opt(k.memory_throughput)},
                  {"tensor_core", opt(k.tensor_core)},
                  {"fp_engine", opt(k.fp_engine)}};
        if (!k.pass.empty()) j["pass"] = k.pass;
        return j;
      };
      json kernels = json::array(), components = json::array();
      for (const KernelCounters& k : c.kernels) kernels.push_back(kernel_json(k));
      for (const KernelCounters& k : c.components) components.push_back(kernel_json(k));
      row["counters"]["kernels"] = kernels;
      row["counters"]["components"] = components;
      row["counters"]["unattributed"] = c.unattributed ? kernel_json(*c.unattributed) : json(nullptr);
      json phases = json::array();
      const std::vector<PhaseRow> modelled = phase_rows(r, report.config.counted_steps());
      for (size_t i = 0; i < c.phases.size(); ++i) {
        const PhaseCounters& p = c.phases[i];
        phases.push_back({{"name", p.name},
                          {"segments", p.segments},
                          {"seconds", p.seconds},
                          {"gpu_seconds", opt(p.gpu_seconds)},
                          {"cpu_seconds", opt(p.cpu_seconds)},
                          {"cycles", opt(p.cycles)},
                          {"instructions", opt(p.instructions)},
                          {"dram_bytes", opt(p.dram_bytes)},
                          {"memory_bandwidth", opt(p.memory_bandwidth)},
                          {"memory_throughput", opt(p.memory_throughput)},
                          {"tensor_core", opt(p.tensor_core)},
                          {"fp_engine", opt(p.fp_engine)},
                          {"kernels", p.kernels},
                          {"modelled_bytes_per_step", opt(modelled[i].modelled_bytes)},
                          {"modelled_seconds_per_step", opt(modelled[i].modelled_seconds)}});
      }
      row["counters"]["phases"] = phases;
    } else {
      row["counters"] = nullptr;
    }
  }
  json cpu = nullptr;
  if (report.cpu_peak) {
    const cost::CpuPeak& p = *report.cpu_peak;
    const cost::CpuFeatures& f = p.features;
    cpu = {{"vendor", f.vendor},
           {"family", f.family},
           {"model", f.model},
           {"model_name", f.model_name},
           {"flags",
            {{"sse2", f.sse2},
             {"avx", f.avx},
             {"fma", f.fma},
             {"avx2", f.avx2},
             {"avx512f", f.avx512f},
             {"avx512_bf16", f.avx512_bf16},
             {"avx512_fp16", f.avx512_fp16},
             {"amx_bf16", f.amx_bf16},
             {"amx_fp16", f.amx_fp16}}},
           {"width_bits", p.layout.width_bits},
           {"fma_units", p.layout.units},
           {"flop_per_instruction", p.layout.flop_per_instruction},
           {"table_row", p.layout.row},
           {"clock_hz", p.clock.hz},
           {"clock_source", p.clock.source},
           {"clock_reported_hz", p.clock.reported_hz},
           {"clock_reported_source", p.clock.reported_source},
           {"clock_measured_hz", p.clock.measured_hz > 0 ? json(p.clock.measured_hz) : json(nullptr)},
           {"threads", p.threads},
           {"cores", p.cores},
           {"fp32_flops", p.fp32},
           {"bf16_flops", p.bf16},
           {"fp16_flops", p.fp16},
           {"bf16_source", p.bf16_source},
           {"fp16_source", p.fp16_source},
           {"formula", p.formula()}};
  }
  json hardware = nullptr;
  if (report.hardware) {
    const cost::HardwareSpec& h = *report.hardware;
    hardware = {{"name", h.name},
                {"source", h.source},
                {"tensor_tflops",
                 {{"bf16", h.tensor_bf16 ? json(h.bf16) : json(nullptr)},
                  {"fp16", h.tensor_fp16 ? json(h.fp16) : json(nullptr)},
                  {"tf32", h.tf32 > 0 ? json(h.tf32) : json(nullptr)}}},
                {"vector_tflops", {{"bf16", h.bf16_vector}, {"fp16", h.fp16_vector}, {"fp32", h.fp32}}},
                {"memory_bandwidth", h.memory_bandwidth}};
  }
  json roofline = nullptr;
  if (report.roofline) roofline = roofline_json(*report.roofline, report.bandwidth_source);
  const json doc = {
      {"model", report.config.model},
      {"num_parameters", report.num_parameters},
      {"dtype", report.config.dtype},
      {"kernels", report.config.kernels},
      {"device", report.device},
      {"peak_tflops", report.peak_tflops > 0 ? json(report.peak_tflops) : json(nullptr)},
      {"peak_name", report.peak_name},
      {"peak_source", report.peak_source},
      {"gradient_checkpointing", report.config.gradient_checkpointing},
      {"recomputation", report.config.recomputation()},
      {"steps", report.config.steps},
      {"warmup", report.config.warmup},
      {"synthetic_data", report.config.dataset_dir.empty()},
      {"counters", report.counters_note},
      {"counters_requested", report.config.counters},
      {"counter_steps", report.config.counters ? json(report.config.counted_steps()) : json(nullptr)},
      {"counters_per_kernel", report.config.counters_per_kernel},
      {"cpu_peak", cpu},
      {"cpu_peak_missing", report.cpu_peak_missing},
      {"measured_gemm_tflops", report.measured_gemm_tflops ? json(*report.measured_gemm_tflops) : json(nullptr)},
      {"measured_gemm_exceeds_peak", report.measured_gemm_exceeds_peak},
      {"hardware", hardware},
      {"roofline", roofline},
      {"warnings", report.warnings},
      {"world_size", report.world_size},
      {"launcher", report.launcher},
      {"backend", report.backend},
      {"zero_stage", report.config.zero_stage},
      {"ddp_overlap", report.config.ddp_overlap},
      {"optimisation",
       {{"learning_rate", report.config.training.learning_rate},
        {"lr_scheduler_type", report.config.training.lr_scheduler_type},
        {"warmup_ratio", report.config.training.warmup_ratio},
        {"warmup_steps", report.config.training.warmup_steps},
        {"weight_decay", report.config.training.weight_decay},
        {"max_grad_norm", report.config.training.max_grad_norm}}},
      {"rows", rows}};
  return doc.dump(2) + "\n";
}

}  // namespace kiln::profile
