#include "kiln/profile/command.h"

#include <cstdio>

#include <fmt/format.h>

#include "kiln/cost/plan.h"
#include "kiln/cost/traffic.h"
#include "kiln/dist/env.h"
#include "kiln/model/llama_config.h"
#include "kiln/profile/plan_report.h"
#include "kiln/profile/reference_report.h"
#include "kiln/profile/report.h"
#include "kiln/profile/sweep.h"

namespace kiln::profile {

namespace {

void print(const std::string& text) {
  fmt::print("{}", text);
  std::fflush(stdout);
}

void say_written(const std::vector<std::string>& paths) {
  for (const auto& path : paths) fmt::print(stderr, "kiln-profile: wrote {}\n", path);
}

// The traffic and FLOP model of one step, per component, from the model's config alone: no
// weights, no tensors, nothing run.
void explain(const ProfileSettings& s) {
  const model::LlamaConfig model = model::load_llama_config(s.run.model);
  const ExplainDevice hw = explain_device(s);
  const cost::RunDescription run = explain_run(s, model, hw);
  ExplainReport e{.model_name = s.run.model,
                  .kernels = s.run.kernels,
                  .device = hw.hardware.name,
                  .traffic = cost::traffic_model(model, run),
                  .roof = cost::roofline(hw.hardware, run.dtype),
                  .bandwidth_source = hw.bandwidth_source,
                  .step_seconds = s.step_seconds};
  if (s.peak_tflops > 0) e.roof.gemm_flops_per_s = s.peak_tflops * 1e12;
  print(s.json ? explain_json(e) : explain_markdown(e));
}

}  // namespace

void run_command(Command command, const std::string& config_path, const Overrides& overrides) {
  const ProfileSettings s = read_settings(command, config_path, overrides);
  switch (command) {
    case Command::kPlan: {
      const cost::PlanReport report = cost::make_plan(plan_config(s));
      print(plan_markdown(report));
      return say_written(write_plan_reports(report, s.run.output_dir, s.formats));
    }
    case Command::kExplain:
      return explain(s);
    case Command::kReference: {
      const ReferenceReport report = reference_report(s.data, s.host_costs);
      print(s.json ? reference_json(report) : reference_markdown(report));
      if (!s.run.output_dir.empty()) say_written(write_reference_reports(report, s.run.output_dir, s.formats));
      return;
    }
    case Command::kSweep:
      break;
  }
  const bool main_rank = dist::read_dist_env().rank == 0;  // a data-parallel sweep: rank 0 reports
  const SweepReport report = run_sweep(s, [&](const ProfileRow& r) {
    if (main_rank)
      fmt::print(stderr, "kiln-profile: {}: {}\n", point_label(r.point), r.status == "ok" ? r.speed() : r.status);
  });
  if (!main_rank) return;
  print(to_markdown(report));
  // A fraction of a peak above 100% is a bug: said on stderr too, where a log keeps it.
  for (const auto& w : report.warnings) fmt::print(stderr, "kiln-profile: WARNING: {}\n", w);
  say_written(write_reports(report, s.run.output_dir, s.formats));
}

}  // namespace kiln::profile
