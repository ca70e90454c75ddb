// Measured time per component (lib/kiln/profile/component_times.h): the attribution on a planted
// list of events whose answer is worked out by hand below, then a profiled sweep of the tiny model
// on the CPU, checked against what the model's structure says the profiler must see (one scope per
// component, layer and micro-batch; one backward node at least per projection) and against the
// wall-clock time of the same steps.
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/common/torch_internals.h"
#include "kiln/profile/component_times.h"
#include "kiln/profile/sweep.h"
#include "support.h"

using kiln::profile::attribute_component_times;
using kiln::torch_internals::OpEvent;

namespace {

OpEvent ev(const std::string& name, uint64_t start_us, uint64_t end_us, uint64_t thread, int64_t seq = -1,
           uint64_t fwd_thread = 0) {
  return OpEvent{name, start_us * 1000, end_us * 1000, thread, fwd_thread, seq};
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

TEST_CASE("component times of a profiled tiny sweep on the CPU", "[profile]") {
  for (const std::string dtype : {"fp32", "bf16"}) {
    CAPTURE(dtype);
    kiln::profile::SweepConfig cfg;
    cfg.model = "tiny";
    cfg.dtype = dtype;
    cfg.device = "cpu";
    cfg.cutoff_lens = {64};
    cfg.batch_sizes = {2};
    cfg.grad_accums = {2};
    cfg.steps = 2;
    cfg.warmup = 1;
    cfg.peak_tflops = 1.0;
    cfg.component_times = true;
    cfg.formats = {};
    const auto t0 = std::chrono::steady_clock::now();
    const auto report = kiln::profile::run_sweep(cfg);
    const double sweep_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
    CHECK(t.profiled_seconds * cfg.steps < sweep_seconds);
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
