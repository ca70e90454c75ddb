// Measured time per component (lib/kiln/profile/counters/component_times.h): the attribution on a planted
// list of events whose answer is worked out by hand below, then a profiled sweep of the tiny model
// on the CPU, checked against what the model's structure says the profiler must see (one scope per
// component, layer and micro-batch; one backward node at least per projection) and against the
// wall-clock time of the same steps.
#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/common/component_scope.h"
#include "kiln/common/torch_internals.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/rmsnorm.h"
#include "kiln/profile/counters/component_times.h"
#include "kiln/profile/sweep.h"
#include "support.h"

using kiln::profile::attribute_component_times;
using kiln::torch_internals::OpEvent;

namespace {

OpEvent ev(const std::string& name, uint64_t start_us, uint64_t end_us, uint64_t thread, int64_t seq = -1,
           uint64_t fwd_thread = 0) {
  return OpEvent{name, start_us * 1000, end_us * 1000, thread, fwd_thread, seq};
}

constexpr int64_t kTinySteps = 2;

// One point of the tiny preset with --component-times (2 micro-batches a step, kTinySteps steps
// profiled), and the sweep's wall time.
std::pair<kiln::profile::SweepReport, double> profile_tiny(const std::string& device, const std::string& dtype,
                                                           int64_t cutoff_len, int64_t batch_size) {
  kiln::profile::ProfileSettings cfg;
  cfg.run.model = "tiny";
  cfg.dtype = dtype;
  cfg.run.device = device;
  cfg.cutoff_len = {cutoff_len};
  cfg.per_device_train_batch_size = {batch_size};
  cfg.gradient_accumulation_steps = {2};
  cfg.steps = kTinySteps;
  cfg.warmup = 1;
  if (device == "cpu") cfg.peak_tflops = 1.0;  // no GEMM timed at the start
  cfg.component_times = true;
  cfg.formats = {};
  const auto t0 = std::chrono::steady_clock::now();
  auto report = kiln::profile::run_sweep(cfg);
  return {std::move(report), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace

TEST_CASE("component times: scopes, their autograd nodes, recomputation and the step, by hand", "[profile]") {
  // Thread 1 runs forward: q_proj (sequence numbers 10-11 drawn: an aten::linear and a custom
  // Function the profiler gives no number), then an unscoped op; its backward runs on thread 2
  // with nodes 11 and 10 (both q_proj's), node 12 (the unscoped op's: unattributed), and a
  // checkpointed layer's node holding a recomputed RMSNorm scope (thread 2 draws 50-51) and that
  // scope's own node 50. Then AdamW. Times in microseconds; two steps' worth (halved per step).
  const std::vector<OpEvent> events = {
      ev("kiln::q_proj", 0, 100, 1, 10),
      ev("aten::linear", 5, 60, 1, 10),
      ev("aten::mm", 10, 55, 1, 10),
      ev("kiln::end", 99, 99, 1, 12),  // numbers 10 and 11 were drawn inside
      ev("aten::mul", 100, 120, 1, 12),
      ev("kiln::backward", 130, 400, 1),
      ev("autograd::engine::evaluate_function: MmBackward0", 140, 180, 2, 11, 1),
      ev("aten::mm", 145, 175, 2, 11, 1),
      ev("autograd::engine::evaluate_function: CppNode<LinearFunction>", 180, 200, 2, 10, 1),
      ev("autograd::engine::evaluate_function: MulBackward0", 200, 210, 2, 12, 1),
      ev("autograd::engine::evaluate_function: CheckpointFunction", 210, 390, 2, 13, 1),
      ev("kiln::input RMSNorm", 220, 260, 2, 50),
      ev("aten::pow", 225, 235, 2, 50),
      ev("kiln::end", 259, 259, 2, 52),
      ev("autograd::engine::evaluate_function: RmsNormBackward", 300, 330, 2, 50, 2),
      ev("kiln::AdamW", 400, 500, 1, 14),
      ev("kiln::end", 499, 499, 1, 14),
  };
  const auto t = attribute_component_times(events, 2);
  // q_proj forward: the scope's 100 us, nothing of interest nested.
  CHECK(t.seconds_of("q_proj", "fwd") == Approx(100e-6 / 2));
  // q_proj backward: nodes 11 (40 us) and 10 (20 us), the custom Function's number found by range.
  CHECK(t.seconds_of("q_proj", "bwd") == Approx(60e-6 / 2));
  CHECK(t.events.at({"q_proj", "bwd"}) == Approx(1.0));  // two nodes over two steps
  // The recomputed RMSNorm (inside kiln::backward) and its own node (forward thread 2).
  CHECK(t.seconds_of("input RMSNorm", "recompute") == Approx(40e-6 / 2));
  CHECK(t.seconds_of("input RMSNorm", "bwd") == Approx(30e-6 / 2));
  CHECK(t.seconds_of("input RMSNorm", "fwd") == 0);
  CHECK(t.seconds_of("AdamW", "step") == Approx(100e-6 / 2));
  // Top level: q_proj 100, mul 20, the four backward nodes 40 + 20 + 10 + 180 (the backward scope
  // is a window, not an event), AdamW 100 = 470 us. Unattributed: the mul (20), node 12 (10) and
  // the checkpoint node's exclusive time (180 - 40 - 30 = 110) = 140 us.
  CHECK(t.profiled_seconds == Approx(470e-6 / 2));
  CHECK(t.unattributed_seconds == Approx(140e-6 / 2));
  CHECK(t.seconds.size() == 5);
}

TEST_CASE("component times on a GPU: activities placed by link, by their launch's link and by its time", "[profile]") {
  using kiln::torch_internals::OpEventKind;
  // The forward (thread 1): an RMSNorm scope whose kiln kernel is launched with no ATen op open
  // (Kineto links it to nothing), q_proj's aten::mm (correlation id 11), an unscoped aten::mul
  // (12), an embedding scope that launches nothing; the backward (thread 2): q_proj's node with an
  // aten::mm (14) and RMSNorm's node (15); AdamW's fused op (16). CPU times in microseconds.
  auto op = [](const std::string& name, uint64_t start, uint64_t end, uint64_t thread, int64_t seq,
               uint64_t correlation = 0, uint64_t fwd_thread = 0) {
    OpEvent e = ev(name, start, end, thread, seq, fwd_thread);
    e.correlation_id = correlation;
    return e;
  };
  // A launch (the runtime call, on a thread id Kineto may not share with the ops) and its GPU
  // activity, on the GPU's own clock (far from the CPU's: only their durations count).
  auto launch = [](uint64_t start, uint64_t correlation, uint64_t linked) {
    OpEvent e = ev("cudaLaunchKernel", start, start + 1, 999);
    e.kind = OpEventKind::launch;
    e.correlation_id = correlation;
    e.linked_correlation_id = linked;
    return e;
  };
  auto activity = [](uint64_t correlation, uint64_t linked, uint64_t duration_us) {
    static uint64_t clock = 1'000'000;
    OpEvent e = ev("kernel", clock, clock + duration_us, 7);
    clock += 1000;
    e.kind = OpEventKind::gpu;
    e.correlation_id = correlation;
    e.linked_correlation_id = linked;
    return e;
  };
  const std::vector<OpEvent> events = {
      op("kiln::input RMSNorm", 0, 20, 1, 1),
      op("kiln::end", 19, 19, 1, 2),
      op("kiln::q_proj", 20, 100, 1, 2),
      op("aten::mm", 30, 60, 1, 2, 11),
      op("kiln::end", 99, 99, 1, 3),
      op("aten::mul", 100, 120, 1, 3, 12),
      op("kiln::embedding lookup", 121, 124, 1, 3),
      op("kiln::backward", 130, 400, 1, -1),
      op("autograd::engine::evaluate_function: MmBackward0", 140, 180, 2, 2, 13, 1),
      op("aten::mm", 145, 175, 2, -1, 14),
      op("autograd::engine::evaluate_function: RmsNormBackward", 180, 200, 2, 1, 15, 1),
      op("kiln::AdamW", 400, 500, 1, 4),
      op("aten::_fused_adamw_", 410, 490, 1, 4, 16),
      op("kiln::end", 499, 499, 1, 4),
      launch(5, 1001, 0),     // the RMSNorm kernel: inside the RMSNorm scope by time
      launch(35, 1002, 11),   // aten::mm's
      launch(101, 1003, 12),  // aten::mul's: placed, in no component
      launch(150, 1004, 14),  // the backward mm's
      launch(160, 1008, 0),   // a kernel of q_proj's node, no op open: the node by time
      launch(185, 1005, 15),  // RMSNorm backward's: the activity lost its link, the launch has it
      launch(420, 1006, 16),  // AdamW's
      launch(125, 1007, 0),   // nothing open at 125 (the embedding scope closed at 124)
      activity(1001, 0, 4),
      activity(1002, 11, 25),
      activity(1003, 12, 6),
      activity(1004, 14, 20),
      activity(1008, 0, 3),
      activity(1005, 0, 8),
      activity(1006, 16, 50),
      activity(1007, 0, 2),
      activity(0, 0, 1),  // no correlation at all
  };
  const auto t = attribute_component_times(events, 1);
  CHECK(t.source == "gpu");
  CHECK(t.seconds_of("input RMSNorm", "fwd") == Approx(4e-6));
  CHECK(t.seconds_of("q_proj", "fwd") == Approx(25e-6));
  CHECK(t.seconds_of("q_proj", "bwd") == Approx(23e-6));
  CHECK(t.seconds_of("input RMSNorm", "bwd") == Approx(8e-6));
  CHECK(t.seconds_of("AdamW", "step") == Approx(50e-6));
  REQUIRE(t.seconds.count({"embedding lookup", "fwd"}) == 1);  // it ran and launched nothing: 0, not absent
  CHECK(t.seconds.at({"embedding lookup", "fwd"}) == 0);
  CHECK(t.seconds.size() == 6);
  CHECK(t.profiled_seconds == Approx(119e-6));
  CHECK(t.unattributed_seconds == Approx(9e-6));  // the mul's 6, the unplaced 2 and 1
  CHECK(t.linked_activities == 5);
  CHECK(t.timed_activities == 2);
  CHECK(t.unplaced_activities == 2);
  // The scopes and nodes are counted as on a CPU.
  CHECK(t.events.at({"q_proj", "fwd"}) == 1);
  CHECK(t.events.at({"q_proj", "bwd"}) == 1);
  // Without GPU activities the same ops give CPU times.
  std::vector<OpEvent> cpu_only;
  for (const OpEvent& e : events)
    if (e.kind == OpEventKind::op) cpu_only.push_back(e);
  const auto c = attribute_component_times(cpu_only, 1);
  CHECK(c.source == "cpu");
  CHECK(c.seconds_of("q_proj", "fwd") == Approx(80e-6));
}

TEST_CASE("component times of a profiled tiny sweep on the CPU", "[profile]") {
  for (const std::string dtype : {"fp32", "bf16"}) {
    CAPTURE(dtype);
    const auto [report, sweep_seconds] = profile_tiny("cpu", dtype, 64, 2);
    REQUIRE(report.rows.size() == 1);
    const auto& row = report.rows[0];
    REQUIRE(row.status == "ok");
    REQUIRE(row.component_times);
    const auto& t = *row.component_times;
    // Per step: 2 layers x 2 micro-batches of each layer scope, 2 of the model-level ones, 1 AdamW.
    const double per_layer = 2.0 * 2.0;
    for (const char* c : {"input RMSNorm", "q_proj", "k_proj", "v_proj", "RoPE (q, k)", "attention core", "o_proj",
                          "post-attention RMSNorm", "gate_proj", "up_proj", "SwiGLU", "down_proj"}) {
      CAPTURE(c);
      CHECK(t.events.at({c, "fwd"}) == Approx(per_layer));
      CHECK(t.seconds_of(c, "fwd") > 0);
    }
    CHECK(t.events.at({"residual adds (2)", "fwd"}) == Approx(2 * per_layer));
    for (const char* c : {"embedding lookup", "RoPE tables (cos, sin)", "final RMSNorm", "LM head + loss"})
      CHECK(t.events.at({c, "fwd"}) == Approx(2.0));
    CHECK(t.events.at({"AdamW", "step"}) == Approx(1.0));
    CHECK(t.events.at({"gradient clipping", "step"}) == Approx(1.0));
    // Backward: every projection's nodes are found (at least one per layer and micro-batch), and so
    // are the fused ops' and the head's.
    for (const char* c : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "input RMSNorm",
                          "SwiGLU", "attention core", "LM head + loss", "embedding lookup"}) {
      CAPTURE(c);
      CHECK(t.events.count({c, "bwd"}) == 1);
      if (t.events.count({c, "bwd"}))
        CHECK(t.events.at({c, "bwd"}) >= per_layer / (c[0] == 'L' || c[0] == 'e' ? 2 : 1));
    }
    // The parts and the rest add up to the profiled time, which lies inside the run's wall clock
    // (one thread runs the step: its top-level events do not overlap). No bound on the rest's share:
    // one preemption inside an unscoped op of a 6 ms step would pass any such bound.
    double attributed = 0;
    for (const auto& [key, s] : t.seconds) attributed += s;
    CHECK(attributed + t.unattributed_seconds == Approx(t.profiled_seconds).epsilon(1e-9));
    CHECK(t.unattributed_seconds >= 0);
    CHECK(t.profiled_seconds * kTinySteps < sweep_seconds);
    // The sweep's per-component rows carry them.
    int measured = 0;
    for (const auto& c : row.components) {
      if (!c.measured_seconds) continue;
      ++measured;
      CHECK(*c.measured_seconds == Approx(t.seconds_of(c.component, c.pass)));
    }
    CHECK(measured >= 30);
  }
}

// On a GPU: what the attribution relies on in Kineto's CUDA records, pinned on two launches (an
// ATen GEMM, whose kernel Kineto links to aten::mm, and a kiln kernel launched straight from its
// scope, linked to nothing, placed by its launch's time); then a profiled tiny sweep whose GPU
// time per component adds up and covers the step.
TEST_CASE("component times on a GPU: Kineto's links, and a profiled tiny sweep", "[profile][component_times][cuda]") {
  REQUIRE(torch::cuda::is_available());
  using kiln::torch_internals::OpEventKind;
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor a = at::randn({512, 512}, bf16), b = at::randn({512, 512}, bf16), w = at::ones({512}, bf16);
  at::Tensor y, z;
  {
    const kiln::ops::BackendScope kiln_kernels("kiln");
    const at::NoGradGuard no_grad;
    torch::cuda::synchronize();
    kiln::torch_internals::OpEventRecorder recorder(/*cuda=*/true);
    {
      const kiln::ComponentScope scope("kiln::q_proj");
      y = at::mm(a, b);
    }
    {
      const kiln::ComponentScope scope("kiln::input RMSNorm");
      z = kiln::ops::rmsnorm(y, w, 1e-5);
    }
    torch::cuda::synchronize();
    const std::vector<OpEvent> events = recorder.stop();
    const OpEvent* mm = nullptr;
    int gpu = 0, launches = 0;
    for (const OpEvent& e : events) {
      if (e.kind == OpEventKind::op && e.name == "aten::mm") mm = &e;
      gpu += e.kind == OpEventKind::gpu;
      launches += e.kind == OpEventKind::launch;
    }
    REQUIRE(mm != nullptr);
    CHECK(mm->correlation_id != 0);
    CHECK(gpu >= 2);
    CHECK(launches >= 2);
    // Every activity shares its correlation id with a launch; the GEMM's names aten::mm.
    bool gemm_linked = false;
    for (const OpEvent& g : events) {
      if (g.kind != OpEventKind::gpu) continue;
      CAPTURE(g.name, g.correlation_id, g.linked_correlation_id);
      CHECK(std::any_of(events.begin(), events.end(), [&](const OpEvent& l) {
        return l.kind == OpEventKind::launch && l.correlation_id == g.correlation_id;
      }));
      gemm_linked |= g.linked_correlation_id == mm->correlation_id;
    }
    CHECK(gemm_linked);
    const auto t = attribute_component_times(events, 1);
    CHECK(t.source == "gpu");
    CHECK(t.seconds_of("q_proj", "fwd") > 0);
    CHECK(t.seconds_of("input RMSNorm", "fwd") > 0);
    CHECK(t.unplaced_activities == 0);
    CHECK(t.unattributed_seconds == Approx(0).margin(1e-12));
  }

  const auto [report, sweep_seconds] = profile_tiny("cuda", "bf16", 256, 4);
  REQUIRE(report.rows.size() == 1);
  const auto& row = report.rows[0];
  REQUIRE(row.status == "ok");
  REQUIRE(row.component_times);
  const auto& t = *row.component_times;
  CAPTURE(t.profiled_seconds, t.unattributed_seconds, t.linked_activities, t.timed_activities, t.unplaced_activities);
  CHECK(t.source == "gpu");
  for (const char* c : {"q_proj", "attention core", "down_proj", "LM head + loss", "input RMSNorm"}) {
    CAPTURE(c);
    CHECK(t.seconds_of(c, "fwd") > 0);
    CHECK(t.seconds_of(c, "bwd") > 0);
  }
  CHECK(t.seconds_of("AdamW", "step") > 0);
  double attributed = 0;
  for (const auto& [key, s] : t.seconds) attributed += s;
  CHECK(attributed + t.unattributed_seconds == Approx(t.profiled_seconds).epsilon(1e-9));
  // Nearly every activity is launched inside a component (no bound would be right for the rest's
  // share of time: the loss's scaling and autograd's sums are kernels too).
  CHECK(t.unplaced_activities <= 0.05 * (t.linked_activities + t.timed_activities + t.unplaced_activities));
  // The GPU's busy time per step lies under the wall time of the steps it was measured over.
  CHECK(t.profiled_seconds * kTinySteps < sweep_seconds);
}
