// The reference stack's pieces (cost/reference.h, cost/caching_allocator.h) against hand counts:
// the caching allocator's rules as c10/cuda/CUDACachingAllocator.cpp states them, the step-time
// rule on a report whose rows are known, and the replayed memory against the analytic moments.
#include <catch2/catch.hpp>

#include <cmath>

#include "kiln/cost/caching_allocator.h"
#include "kiln/cost/reference.h"
#include "kiln/cost/traffic.h"
#include "kiln/model/llama_config.h"

using kiln::cost::CachingAllocatorModel;

namespace {
constexpr double MiB = 1048576.0;
}

TEST_CASE("caching allocator model: segment sizes, rounding, best fit, splitting, merging", "[profile][reference]") {
  SECTION("sizes round to 512 bytes; the small pool reserves 2 MiB segments") {
    CachingAllocatorModel a;
    CHECK(CachingAllocatorModel::round_size(1) == 512);
    CHECK(CachingAllocatorModel::round_size(513) == 1024);
    const auto x = a.allocate(1000);
    CHECK(a.allocated() == 1024);
    CHECK(a.reserved() == 2 * MiB);
    a.allocate(1000);  // splits the same segment
    CHECK(a.reserved() == 2 * MiB);
    a.free(x);
    CHECK(a.allocated() == 1024);
  }
  SECTION("1-10 MiB requests take 20 MiB segments, larger ones their size rounded to 2 MiB") {
    CachingAllocatorModel a;
    a.allocate(3 * MiB);
    CHECK(a.reserved() == 20 * MiB);
    a.allocate(5 * MiB);  // fits the first segment's 17 MiB rest
    CHECK(a.reserved() == 20 * MiB);
    a.allocate(11 * MiB);  // the rest, 12 MiB, holds it: split off, no new segment
    CHECK(a.reserved() == 20 * MiB);
    a.allocate(13 * MiB);
    CHECK(a.reserved() == 34 * MiB);  // 20 + 14 (13 rounded up to 2 MiB)
  }
  SECTION("a freed block serves a smaller request, never a larger one; neighbours merge") {
    CachingAllocatorModel a;
    const auto big = a.allocate(100 * MiB);
    a.free(big);
    const auto half = a.allocate(50 * MiB);  // split from the cached 100 MiB
    CHECK(a.reserved() == 100 * MiB);
    a.allocate(200 * MiB);  // no cached block holds it
    CHECK(a.reserved() == 300 * MiB);
    a.free(half);  // merges back with its 50 MiB rest
    a.allocate(100 * MiB);
    CHECK(a.reserved() == 300 * MiB);
  }
  SECTION("the stranded block of the reference loss chain: 2 bytes per logit freed before three 4-byte tensors") {
    CachingAllocatorModel a;
    const double nv = 1024.0 * 128256.0;
    const auto low = a.allocate(2 * nv);
    const auto up = a.allocate(4 * nv);
    a.free(low);
    a.allocate(4 * nv);
    a.allocate(4 * nv);
    // Each tensor over 10 MiB gets a segment rounded up to 2 MiB; a block whose rest would be at
    // most 1 MiB is handed out whole, so the allocated bytes are the segments' too.
    auto segment = [](double bytes) { return std::ceil(bytes / (2 * MiB)) * 2 * MiB; };
    CHECK(a.peak_allocated() == 3 * segment(4 * nv));
    CHECK(a.reserved() == segment(2 * nv) + 3 * segment(4 * nv));  // the 2-byte block stays reserved
    a.free(up);
  }
}

TEST_CASE("step time: max(host, device) per synchronised stretch", "[profile][reference]") {
  kiln::model::LlamaConfig m = kiln::model::load_llama_config("tiny");
  kiln::cost::RunDescription run;
  run.batch = 2, run.cutoff_len = 64, run.gradient_accumulation_steps = 4, run.dtype = "bf16";
  const auto report = kiln::cost::traffic_model(m, run);
  kiln::cost::HardwareSpec hw = *kiln::cost::hardware_spec("A100-80GB");
  const auto roof = kiln::cost::roofline(hw, "bf16");
  double device_mb = 0, device_step = 0;
  for (const auto& row : report.rows) {
    const double s = roof.seconds(row.kiln) * row.repeats;
    (row.pass == kiln::cost::Pass::kStep ? device_step : device_mb) += row.pass == kiln::cost::Pass::kStep ? s : s / 4;
  }
  kiln::cost::HostModel host;
  host.ops = {10, 5, 20, 7, 30, 0, 0};
  host.seconds_per_op = 1e-5;
  host.fixed_per_micro_batch = 2e-3;
  host.fixed_per_step = 1e-3;
  const double ops_mb = 10 + 5.0 * m.num_hidden_layers + 20 + 7.0 * m.num_hidden_layers;
  SECTION("synchronised per micro-batch (transformers' Trainer)") {
    host.sync_per_micro_batch = true;
    const auto t = kiln::cost::step_time(report, roof, host, false);
    CHECK(t.device_micro_batch == Approx(device_mb));
    CHECK(t.device_step == Approx(device_step));
    CHECK(t.ops_per_step == Approx(4 * ops_mb + 30));
    CHECK(t.seconds ==
          Approx(4 * (2e-3 + std::max(ops_mb * 1e-5, device_mb)) + 1e-3 + std::max(30 * 1e-5, device_step)));
  }
  SECTION("unsynchronised (kiln): the host runs ahead for the whole step") {
    const auto t = kiln::cost::step_time(report, roof, host, false);
    const double host_all = 4 * (ops_mb * 1e-5 + 2e-3) + 30 * 1e-5 + 1e-3;
    CHECK(t.seconds == Approx(std::max(host_all, 4 * device_mb + device_step)));
    CHECK(t.host_bound == (host_all > 4 * device_mb + device_step));
  }
}

TEST_CASE("reference memory: the replay holds at least the analytic moment and at most its segments' worth",
          "[profile][reference]") {
  const kiln::model::LlamaConfig m = kiln::model::load_llama_config("tiny");
  for (const char* dtype : {"fp16", "fp32"}) {
    for (int64_t t : {1, 256, 2048}) {
      kiln::cost::RunDescription run;
      run.batch = 2, run.cutoff_len = t, run.dtype = dtype;
      run = kiln::cost::reference_run(run);
      const auto mem = kiln::cost::reference_memory(m, run);
      double analytic = 0;
      for (const auto& [name, bytes] : mem.components) analytic += bytes;
      INFO(dtype << " T " << t << " analytic " << analytic << " allocated " << mem.allocated << " reserved "
                 << mem.reserved);
      // The replay's live peak covers the analytic moment's tensors (within the 512-byte rounding and
      // the few tensors the analytic moment leaves out), and the segments cover the live peak.
      CHECK(mem.allocated >= 0.97 * analytic);
      CHECK(mem.reserved >= mem.allocated);
      CHECK(mem.total() == Approx(mem.reserved + kiln::cost::kCudaContextBytes));
    }
  }
}

TEST_CASE("the reference stack's attention: SDPA with repeat_kv's copies, no T x T tensor", "[profile][reference]") {
  const kiln::model::LlamaConfig m = kiln::model::load_llama_config("llama-100m");  // GQA 12:4
  kiln::cost::RunDescription run;
  run.batch = 1, run.dtype = "fp16";
  auto attention_bytes = [&](int64_t t, bool sdpa) {
    run.cutoff_len = t;
    const auto r = kiln::cost::traffic_model(m, run, {sdpa, false});
    return r.find("attention core", kiln::cost::Pass::kForward)->eager.bytes;
  };
  // SDPA's traffic grows linearly with T, eager's with T^2.
  CHECK(attention_bytes(4096, true) / attention_bytes(2048, true) == Approx(2.0).epsilon(0.01));
  CHECK(attention_bytes(4096, false) / attention_bytes(2048, false) > 3.5);
  // The repeat: K and V copied from 4 to 12 heads (R c ekv W c eq each) on top of SDPA's own.
  run.cutoff_len = 1024;
  const double n = 1024, c = 2, ekv = n * 256, eq = n * 768;
  const auto hf = kiln::cost::traffic_model(m, run, {true, false});
  // SDPA's own forward (kiln's column with attention sdpa, under autocast) reads q and K/V of the
  // kv heads and casts them; transformers' reads K/V repeated to every head, uncast: the difference
  // is the repeat's copies plus SDPA over 12 heads of K/V instead of 4, minus the casts.
  const double sdpa_repeated = c * (eq + 2 * eq) + c * eq + 4 * n * 12 + 2 * c * eq;
  CHECK(hf.find("attention core", kiln::cost::Pass::kForward)->eager.bytes ==
        Approx(sdpa_repeated + 2 * (c * ekv + c * eq)));
  // The shifted logits' copy: 8 bytes per logit forward, 12 backward, on the eager column only.
  const auto shifted = kiln::cost::traffic_model(m, run, {true, true});
  const double nv = n * m.vocab_size;
  CHECK(shifted.find("LM head + loss", kiln::cost::Pass::kForward)->eager.bytes -
            hf.find("LM head + loss", kiln::cost::Pass::kForward)->eager.bytes ==
        Approx(8 * nv));
  CHECK(shifted.find("LM head + loss", kiln::cost::Pass::kBackward)->eager.bytes -
            hf.find("LM head + loss", kiln::cost::Pass::kBackward)->eager.bytes ==
        Approx(12 * nv));
  CHECK(shifted.find("LM head + loss", kiln::cost::Pass::kForward)->kiln.bytes ==
        hf.find("LM head + loss", kiln::cost::Pass::kForward)->kiln.bytes);
}
