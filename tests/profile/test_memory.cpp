// The memory model and the counting CPU allocator. References: exact byte counts of tensors
// whose sizes are known (numel x element size) for the allocator; for the model, the peak tensor
// bytes of a real training step (the trainer's step through kiln::profile::run_sweep) counted by
// that allocator, which the analytic prediction must match within 15% (issue 6's bound).
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "kiln/cost/flops.h"
#include "kiln/cost/memory.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/profile/counters/cpu_allocator.h"
#include "kiln/profile/report.h"
#include "kiln/profile/sweep.h"
#include "kiln/train/kernel_choices.h"

using kiln::profile::CountingCpuAllocatorGuard;

TEST_CASE("counting CPU allocator counts tensor bytes, current and peak", "[profile]") {
  CountingCpuAllocatorGuard guard;
  const int64_t base = guard.stats().current_bytes;
  at::Tensor a = at::empty({1000}, at::kFloat);  // 4000 bytes
  CHECK(guard.stats().current_bytes - base == 4000);
  {
    at::Tensor b = at::empty({250, 4}, at::kDouble);  // 8000 bytes
    CHECK(guard.stats().current_bytes - base == 12000);
  }
  CHECK(guard.stats().current_bytes - base == 4000);
  CHECK(guard.stats().peak_bytes - base == 12000);
  guard.reset_peak();
  CHECK(guard.stats().peak_bytes == guard.stats().current_bytes);
  a = at::Tensor();
  CHECK(guard.stats().current_bytes == base);
}

TEST_CASE("counting CPU allocator: a cap raises OutOfMemoryError and frees nothing it should not", "[profile]") {
  CountingCpuAllocatorGuard guard;
  const int64_t base = guard.stats().current_bytes;
  guard.set_cap(base + (1 << 20));
  at::Tensor small = at::empty({1024}, at::kFloat);
  CHECK_THROWS_AS(at::empty({1 << 20}, at::kFloat), c10::OutOfMemoryError);
  CHECK(guard.stats().current_bytes - base == 4096);  // the failed request is not counted
  guard.set_cap(0);
  CHECK_NOTHROW(at::empty({1 << 20}, at::kFloat));
}

TEST_CASE("counting CPU allocator is removed by its guard", "[profile]") {
  at::Allocator* before = c10::GetCPUAllocator();
  {
    CountingCpuAllocatorGuard guard;
    CHECK(c10::GetCPUAllocator() != before);
    CHECK_THROWS_AS(CountingCpuAllocatorGuard(), std::logic_error);
  }
  CHECK(c10::GetCPUAllocator() == before);
}

TEST_CASE("counting CPU allocator: every entry point of c10's allocator interface counts", "[profile]") {
  CountingCpuAllocatorGuard guard;
  c10::Allocator* a = c10::GetCPUAllocator();
  REQUIRE(a == CountingCpuAllocatorGuard::allocator());
  const int64_t base = guard.stats().current_bytes;

  SECTION("allocate: the DataPtr's context is its data pointer, and its deleter is raw_deleter()") {
    c10::DataPtr p = a->allocate(1000);
    REQUIRE(p.get() != nullptr);
    CHECK(p.get_context() == p.get());
    CHECK(p.get_deleter() == a->raw_deleter());
    CHECK(a->is_simple_data_ptr(p));
    CHECK(guard.stats().current_bytes - base == 1000);
    p.clear();
    CHECK(guard.stats().current_bytes == base);
  }
  SECTION("raw_allocate / raw_deallocate (oneDNN's path)") {
    REQUIRE(a->raw_deleter() != nullptr);
    CHECK(a->raw_deleter() == a->raw_deleter());
    void* p = a->raw_allocate(4096);
    REQUIRE(p != nullptr);
    std::memset(p, 0xAB, 4096);  // the memory is usable
    CHECK(guard.stats().current_bytes - base == 4096);
    CHECK(guard.stats().peak_bytes - base >= 4096);
    a->raw_deallocate(p);
    CHECK(guard.stats().current_bytes == base);
    a->raw_deleter()(a->raw_allocate(64));  // the deleter alone frees it too
    CHECK(guard.stats().current_bytes == base);
  }
  SECTION("clone and copy_data") {
    c10::DataPtr src = a->allocate(256);
    for (int i = 0; i < 256; ++i) static_cast<unsigned char*>(src.get())[i] = static_cast<unsigned char>(i);
    c10::DataPtr copy = a->clone(src.get(), 256);
    CHECK(guard.stats().current_bytes - base == 512);
    CHECK(std::memcmp(copy.get(), src.get(), 256) == 0);
    c10::DataPtr dst = a->allocate(256);
    a->copy_data(dst.get(), src.get(), 256);
    CHECK(std::memcmp(dst.get(), src.get(), 256) == 0);
    CHECK(guard.stats().current_bytes - base == 768);
    src.clear();
    copy.clear();
    dst.clear();
    CHECK(guard.stats().current_bytes == base);
  }
  SECTION("zero bytes") {
    c10::DataPtr p = a->allocate(0);
    void* r = a->raw_allocate(0);
    CHECK(guard.stats().current_bytes == base);
    a->raw_deallocate(r);
    p.clear();
    CHECK(guard.stats().current_bytes == base);
  }
  SECTION("the cap applies to the raw path too, and a refused request is not counted") {
    guard.set_cap(base + 10'000);
    void* ok = a->raw_allocate(6'000);
    CHECK_THROWS_AS(a->raw_allocate(6'000), c10::OutOfMemoryError);
    CHECK_THROWS_AS(a->clone(ok, 6'000), c10::OutOfMemoryError);
    CHECK(guard.stats().current_bytes - base == 6'000);
    a->raw_deallocate(ok);
    CHECK(guard.stats().current_bytes == base);
  }
  SECTION("allocations from ATen's worker threads count, and freeing after the guard is gone still counts") {
    std::vector<c10::DataPtr> held(64);
    at::parallel_for(0, 64, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) held[i] = a->allocate(100 + i);
    });
    CHECK(guard.stats().current_bytes - base == 64 * 100 + 63 * 64 / 2);
    held.clear();
    CHECK(guard.stats().current_bytes == base);
  }
}

TEST_CASE("counting CPU allocator: a tensor freed after its guard is removed is still subtracted", "[profile]") {
  at::Tensor t;
  int64_t base = 0;
  {
    CountingCpuAllocatorGuard guard;
    base = guard.stats().current_bytes;
    t = at::empty({1000}, at::kFloat);
  }
  CountingCpuAllocatorGuard again;
  CHECK(again.stats().current_bytes - base == 4000);
  t = at::Tensor();
  CHECK(again.stats().current_bytes == base);
}

// oneDNN's bf16 matmul and convolution paths (taken on CPUs with AVX512_BF16/AMX, and not with
// ONEDNN_MAX_CPU_ISA=AVX2, which the test command also runs) allocate through raw_allocate.
TEST_CASE("counting CPU allocator under bf16 matmul, linear and their backward", "[profile]") {
  CountingCpuAllocatorGuard guard;
  const int64_t base = guard.stats().current_bytes;
  {
    at::Tensor x = at::randn({64, 256}).to(at::kBFloat16).requires_grad_();
    at::Tensor w = at::randn({512, 256}).to(at::kBFloat16).requires_grad_();
    at::Tensor y = at::linear(x, w);
    at::Tensor z = at::matmul(y, w);
    z.sum().backward();
    const at::Tensor reference =
        at::matmul(at::linear(x.detach().to(at::kFloat), w.detach().to(at::kFloat)), w.detach().to(at::kFloat));
    // bf16 inputs and a bf16 intermediate: about 1% relative error in norm.
    CHECK((z.detach().to(at::kFloat) - reference).norm().item<double>() / reference.norm().item<double>() < 0.03);
    CHECK(x.grad().defined());
    CHECK(guard.stats().peak_bytes - base >= 64 * 512 * 2);
  }
  CHECK(guard.stats().current_bytes == base);
}

TEST_CASE("memory model: components and phases", "[profile]") {
  const auto c = kiln::model::load_llama_config("llama-3.2-1b");
  const double n = 1235814400.0;
  using kiln::cost::RunDescription;
  const auto m =
      kiln::cost::estimate_training_memory(c, RunDescription{.batch = 16, .cutoff_len = 1024, .dtype = "bf16"});
  CHECK(m.component("parameters (fp32)") == 4.0 * n);
  CHECK(m.component("optimizer (AdamW, fp32)") == 8.0 * n);
  CHECK(m.peak_phase == "forward/backward boundary");
  // Head: final norm (8 + 2) H plus 16 bytes per vocabulary entry, per token.
  CHECK(m.component("logits and loss") == Approx(16.0 * 1024 * (10.0 * 2048 + 16.0 * 128256)));
  // A single token: the gradients at the end of backward dominate (tied: one extra fp32 copy).
  const auto one =
      kiln::cost::estimate_training_memory(c, RunDescription{.batch = 1, .cutoff_len = 1, .dtype = "bf16"});
  CHECK(one.peak_phase == "end of backward");
  CHECK(one.total() == Approx(16.0 * n + 4.0 * 128256 * 2048));
  // Checkpointing keeps less; fp32 keeps more.
  CHECK(kiln::cost::estimate_training_memory(
            c, RunDescription{.batch = 16, .cutoff_len = 1024, .dtype = "bf16", .recompute = "full"})
            .total() < m.total());
  CHECK(kiln::cost::estimate_training_memory(c, RunDescription{.batch = 16, .cutoff_len = 1024, .dtype = "fp32"})
            .total() > m.total());
}

namespace {
void check_sweep_within_15_percent(const std::string& model, const std::string& dtype, std::vector<int64_t> cutoffs,
                                   std::vector<int64_t> batches, int64_t warmup, const std::string& kernels = "aten",
                                   int64_t recompute_every = 0, bool selective = false) {
  kiln::profile::ProfileSettings cfg;
  cfg.run.model = model;
  cfg.dtype = dtype;
  cfg.run.device = "cpu";
  cfg.cutoff_len = std::move(cutoffs);
  cfg.per_device_train_batch_size = std::move(batches);
  cfg.steps = 1;
  cfg.warmup = warmup;
  cfg.peak_tflops = 1.0;  // skip the CPU peak measurement
  // "aten": what autograd saves for each op's ATen composition; "kiln": the fused ops' own saved
  // tensors (their CPU backward works in bounded blocks, like the kernels, so the peak is comparable).
  cfg.run.kernels = kernels;
  cfg.run.gradient_checkpointing = recompute_every > 0;    // 0: none; 1: every layer (full); n: every_n
  cfg.run.gradient_checkpointing_every = recompute_every;  // 0 = not given (none, or selective)
  if (selective) {
    cfg.run.gradient_checkpointing = true;
    cfg.run.gradient_checkpointing_policy = "selective";
  }
  const std::string before = kiln::ops::backends_spec();
  const auto report = kiln::profile::run_sweep(cfg);
  CHECK(kiln::ops::backends_spec() == before);  // the sweep restored the process's setting
  for (const auto& r : report.rows) {
    INFO(model << " " << dtype << " kernels " << kernels << " recompute " << cfg.run_recomputation() << " cutoff_len "
               << r.point.cutoff_len << " batch " << r.point.batch_size << ": measured " << r.peak_allocated_bytes
               << " predicted " << r.predicted.total());
    REQUIRE(r.status == "ok");
    CHECK(r.ratio() > 0.85);
    CHECK(r.ratio() < 1.15);
  }
}
}  // namespace

TEST_CASE("memory model within 15% of the counted CPU peak: tiny", "[profile]") {
  check_sweep_within_15_percent("tiny", "fp32", {64, 256, 1024}, {1}, 0);
  check_sweep_within_15_percent("tiny", "bf16", {64, 256}, {1}, 0);
}

TEST_CASE("memory model within 15% of the counted CPU peak: tiny, kiln's fused ops", "[profile]") {
  check_sweep_within_15_percent("tiny", "fp32", {64, 256, 1024}, {1}, 0, "kiln");
  check_sweep_within_15_percent("tiny", "bf16", {64, 256, 1024}, {1}, 0, "kiln");
}

TEST_CASE("memory model within 15% of the counted CPU peak: bf16 projections through fp32 GEMMs or natively",
          "[profile]") {
  // ops::linear's CPU rule depends on the CPU (AMX); both paths, and the model's term for each, on any machine.
  for (int fp32 : {1, 0}) {
    CAPTURE(fp32);
    kiln::ops::testing::force_cpu_linear_fp32(fp32);
    check_sweep_within_15_percent("tiny", "bf16", {256, 1024}, {1}, 0, "kiln");
    check_sweep_within_15_percent("llama-100m", "bf16", {64}, {1}, 0, "kiln");
  }
  kiln::ops::testing::force_cpu_linear_fp32(-1);
}

TEST_CASE("memory model within 15% of the counted CPU peak: tiny, larger batches", "[profile][slow]") {
  check_sweep_within_15_percent("tiny", "fp32", {64, 256, 1024}, {4}, 1);
  check_sweep_within_15_percent("tiny", "bf16", {64, 256, 1024}, {1, 4}, 1);
}

TEST_CASE("memory model within 15% of the counted CPU peak: llama-100m, short", "[profile]") {
  check_sweep_within_15_percent("llama-100m", "fp32", {64}, {1}, 0);
  check_sweep_within_15_percent("llama-100m", "fp32", {64}, {1}, 0, "kiln");  // tied head: one gradient copy
}

TEST_CASE("memory model within 15% of the counted CPU peak: llama-100m, long", "[profile][slow]") {
  check_sweep_within_15_percent("llama-100m", "fp32", {256, 512, 1024}, {1}, 0);
  check_sweep_within_15_percent("llama-100m", "bf16", {256}, {1}, 0);
  check_sweep_within_15_percent("llama-100m", "fp32", {64, 256, 1024}, {1}, 0, "kiln");
  check_sweep_within_15_percent("llama-100m", "bf16", {64, 256, 1024}, {1}, 0, "kiln");
}

TEST_CASE("an out-of-memory point is marked OOM and the sweep goes on", "[profile]") {
  kiln::profile::ProfileSettings cfg;
  cfg.run.model = "tiny";
  cfg.dtype = "fp32";
  cfg.run.device = "cpu";
  cfg.cutoff_len = {16, 1024};
  cfg.per_device_train_batch_size = {1};
  cfg.steps = 1;
  cfg.warmup = 0;
  cfg.peak_tflops = 1.0;
  // tiny at cutoff 16 peaks near 7.7 MB, at 1024 near 34 MB (test above): a 20 MB cap fails the second only.
  cfg.memory_cap_bytes = 20'000'000;
  const auto report = kiln::profile::run_sweep(cfg);
  REQUIRE(report.rows.size() == 2);
  CHECK(report.rows[0].status == "ok");
  CHECK(report.rows[1].status == "OOM");
  CHECK(report.rows[1].message.find("memory cap") != std::string::npos);
}

TEST_CASE("the memory model's data-parallel terms per rank and ZeRO stage", "[profile]") {
  using kiln::cost::estimate_training_memory;
  using kiln::cost::RunDescription;
  const auto c = kiln::model::load_llama_config("llama-3.2-1b");
  const double n = static_cast<double>(c.num_parameters());
  auto est = [&](bool dp, int world, int stage) {
    return estimate_training_memory(
        c, RunDescription{.batch = 1,
                          .cutoff_len = 2048,
                          .dtype = "bf16",
                          .kernels = kiln::train::kernel_choices("kiln", "bf16", false),
                          .parallel = {.data_parallel = dp, .world_size = world, .zero_stage = stage}});
  };
  // bf16 matmuls (as on a GPU or an AMX CPU): autocast's weight copies keep the forward side the peak.
  kiln::ops::testing::force_cpu_head_fp32(0);
  kiln::ops::testing::force_cpu_linear_fp32(0);
  const auto one = est(false, 1, 0), s0 = est(true, 8, 0), s1 = est(true, 8, 1), s2 = est(true, 8, 2);
  kiln::ops::testing::force_cpu_head_fp32(-1);
  kiln::ops::testing::force_cpu_linear_fp32(-1);
  CHECK(one.component("optimizer (AdamW, fp32)") == Approx(8 * n));
  CHECK(s0.component("optimizer (AdamW, fp32)") == Approx(8 * n));
  CHECK(s1.component("optimizer (AdamW, fp32)") == Approx(n));
  CHECK(s2.component("optimizer (AdamW, fp32)") == Approx(n));
  // Stages 0 and 1 keep the flat gradient buffer for the whole step; stage 2 a 1/8 shard.
  CHECK(s0.component("gradient buffer (data parallel)") == Approx(4 * n));
  CHECK(s1.component("gradient buffer (data parallel)") == Approx(4 * n));
  CHECK(s2.component("gradient buffer (data parallel)") == Approx(n / 2));
  CHECK(s0.total() == Approx(one.total() + 4 * n));  // the forward side dominates both
  CHECK(s1.total() == Approx(s0.total() - 7 * n));
  CHECK(s2.total() < s1.total());
}

TEST_CASE("memory model within 15% of the counted CPU peak for each recomputation policy", "[profile]") {
  for (const int64_t every : {1, 2}) {  // full, every_n with n = 2 (none is the cases above)
    check_sweep_within_15_percent("tiny", "fp32", {256, 1024}, {2}, 0, "kiln", every);
    check_sweep_within_15_percent("llama-100m", "fp32", {64, 128}, {1}, 0, "kiln", every);
  }
}

TEST_CASE("memory model within 15% of the counted CPU peak: selective recomputation", "[profile]") {
  check_sweep_within_15_percent("tiny", "fp32", {256, 1024}, {2}, 0, "kiln", 0, true);
  check_sweep_within_15_percent("tiny", "fp32", {256, 1024}, {2}, 0, "aten", 0, true);
  // bf16 at 1024 only: at 256 x 2 tokens the CPU backward's fixed-size fp32 blocks (ops/swiglu.cpp)
  // are a large share of tiny's peak, which the model (GPU kernels keep them in registers) omits.
  check_sweep_within_15_percent("tiny", "bf16", {1024}, {2}, 0, "kiln", 0, true);
  check_sweep_within_15_percent("llama-100m", "fp32", {64, 128}, {1}, 0, "kiln", 0, true);
}

TEST_CASE("memory model within 15% of the counted CPU peak: selective recomputation, llama-100m long",
          "[profile][slow]") {
  // Where the activations, not the gradients, make the peak.
  check_sweep_within_15_percent("llama-100m", "fp32", {512, 1024}, {1}, 0, "kiln", 0, true);
}

TEST_CASE("memory model: selective recomputation's per-layer term", "[profile]") {
  using kiln::cost::estimate_training_memory;
  using kiln::cost::RunDescription;
  const auto c = kiln::model::load_llama_config("llama-3.2-1b");
  const double h = 2048, q = 2048, kv = 512, f = 8192, layers = 16, tokens = 4.0 * 2048;
  auto est = [&](const std::string& recompute) {
    return estimate_training_memory(c, RunDescription{.batch = 4,
                                                      .cutoff_len = 2048,
                                                      .dtype = "bf16",
                                                      .recompute = recompute,
                                                      .kernels = kiln::train::kernel_choices("kiln", "bf16", false)});
  };
  const auto none = est("none"), selective = est("selective"), full = est("full");
  // Two fp32 residuals, q/k/v and the attention output in bf16, gate and up in bf16; once the
  // top layer's F-sized backward temporary.
  CHECK(selective.component("activations") ==
        Approx(tokens * (layers * (8 * h + 2 * (2 * q + 2 * kv + 2 * f)) + 2 * f)));
  CHECK(full.total() < selective.total());
  CHECK(selective.total() < none.total());
  // (`selective` without gradient_checkpointing, which MemoryOptions could say and was checked
  // to change nothing, is no description now: RunDescription has one recompute field, and
  // train::resolve_recomputation refuses the policy without gradient_checkpointing.)
  const auto flops = kiln::cost::flops_per_token(c, 2048);
  CHECK(flops.train_selective() > flops.train());
  CHECK(flops.train_selective() < flops.train() * 1.001);  // no matmul is recomputed
}

TEST_CASE("compute_dtype_bytes: the one size of a compute dtype", "[profile][memory]") {
  CHECK(kiln::cost::compute_dtype_bytes("fp32") == 4);
  CHECK(kiln::cost::compute_dtype_bytes("bf16") == 2);
  CHECK(kiln::cost::compute_dtype_bytes("fp16") == 2);
  CHECK_THROWS_WITH(kiln::cost::compute_dtype_bytes("int8"),
                    Catch::Matchers::Contains("'int8' is not fp32, bf16 or fp16"));
}

TEST_CASE("a grid's recomputation list runs each point with each, as the keys would", "[profile]") {
  kiln::profile::ProfileSettings cfg;
  cfg.run.model = "tiny";
  cfg.dtype = "fp32";
  cfg.run.device = "cpu";
  cfg.run.kernels = "aten";
  cfg.cutoff_len = {256};
  cfg.recomputation = {"none", "full"};
  cfg.steps = 1;
  cfg.warmup = 0;
  cfg.peak_tflops = 1.0;
  const auto report = kiln::profile::run_sweep(cfg);
  REQUIRE(report.rows.size() == 2);
  for (const auto& r : report.rows) {
    INFO(r.point.recomputation << ": measured " << r.peak_allocated_bytes << " predicted " << r.predicted.total());
    REQUIRE(r.status == "ok");
    CHECK(r.ratio() > 0.85);
    CHECK(r.ratio() < 1.15);
  }
  CHECK(report.rows[0].point.recomputation == "none");
  // Recomputing every layer holds fewer activations: the model and the counted peak agree.
  CHECK(report.rows[1].predicted.total() < report.rows[0].predicted.total());
  CHECK(report.rows[1].peak_allocated_bytes < report.rows[0].peak_allocated_bytes);
  // The reports tell the rows apart: a recomputation column after cutoff_len, and in the JSON.
  const std::string md = kiln::profile::to_markdown(report);
  CHECK(md.find("| cutoff_len | recomputation | memory usage (GB) |") != std::string::npos);
  CHECK(md.find("| 256 | full |") != std::string::npos);
  CHECK(kiln::profile::to_json(report).find("\"recomputation\": \"full\"") != std::string::npos);
}
