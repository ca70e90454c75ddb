// Peaks that hold: the CPU's theoretical peak (cost/cpu_peak.h) against the arithmetic written out
// here (cores x fp32 lanes x FMA units x 2 FLOP x clock), the FMA table's rows against the vendors'
// manuals' figures, the clock and core readers against planted sysfs and /proc/cpuinfo trees, the
// GPU table's tensor and non-tensor peaks against the data sheets, and the check that reports a
// fraction of a peak above 100% as a bug.
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <fstream>

#include "kiln/common/device.h"
#include "kiln/cost/cpu_peak.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/traffic.h"
#include "support.h"

namespace cost = kiln::cost;

namespace {

cost::CpuFeatures cpu(const char* vendor, int family, int model, bool avx512 = false) {
  cost::CpuFeatures f;
  f.vendor = vendor;
  f.family = family;
  f.model = model;
  f.sse2 = f.avx = f.fma = f.avx2 = true;
  f.avx512f = avx512;
  return f;
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

cost::CpuFeatures amx(cost::CpuFeatures f) {
  f.amx_bf16 = f.avx512_bf16 = f.avx512_fp16 = true;
  return f;
}

}  // namespace

TEST_CASE("the FMA table: datapath width and FMA units per core by vendor, family and model", "[cost]") {
  struct Row {
    cost::CpuFeatures f;
    int width, units;
    const char* name;
  };
  const Row rows[] = {
      {cpu("AuthenticAMD", 0x17, 0x01), 128, 2, "Zen/Zen+"},     // EPYC 7001: AVX2 split into 128-bit halves
      {cpu("AuthenticAMD", 0x17, 0x31), 256, 2, "Zen 2"},        // EPYC 7002 (Rome)
      {cpu("AuthenticAMD", 0x19, 0x01), 256, 2, "Zen 3"},        // EPYC 7003 (Milan): this VM's CPU
      {cpu("AuthenticAMD", 0x19, 0x11, true), 256, 2, "Zen 4"},  // EPYC 9004 (Genoa): AVX-512 in halves
      {cpu("AuthenticAMD", 0x19, 0x61, true), 256, 2, "Zen 4"},  // Ryzen 7000
      {cpu("AuthenticAMD", 0x1a, 0x02, true), 512, 2, "Zen 5"},  // EPYC 9005 (Turin)
      {cpu("AuthenticAMD", 0x1a, 0x24, true), 256, 2, "Zen 5 mobile"},
      {cpu("GenuineIntel", 6, 0x3c), 256, 2, "AVX2/FMA"},      // Haswell
      {cpu("GenuineIntel", 6, 0x8f, true), 512, 2, "Xeon"},    // Sapphire Rapids
      {cpu("GenuineIntel", 6, 0x55, true), 512, 2, "Xeon"},    // Skylake-SP / Cascade Lake
      {cpu("GenuineIntel", 6, 0x7e, true), 512, 1, "client"},  // Ice Lake client
      // A Sapphire Rapids guest whose hypervisor shows Rocket Lake's model: AMX decides.
      {amx(cpu("GenuineIntel", 6, 0xa7, true)), 512, 2, "Sapphire Rapids and later"},
      {cpu("CentaurHauls", 7, 0x3b, true), 512, 2, "upper bound"},  // no row: the widest the flags allow
  };
  for (const Row& r : rows) {
    CAPTURE(r.f.vendor, r.f.family, r.f.model);
    const auto layout = cost::simd_layout(r.f);
    REQUIRE(layout);
    CHECK(layout->width_bits == r.width);
    CHECK(layout->units == r.units);
    CHECK(layout->flop_per_instruction == 2);
    CHECK(layout->row.find(r.name) != std::string::npos);
    CHECK(layout->row.find("table") != std::string::npos);
  }
  // Without FMA: one add and one multiply pipe (Sandy Bridge's AVX); nothing without SSE2.
  cost::CpuFeatures sandy = cpu("GenuineIntel", 6, 0x2a);
  sandy.fma = sandy.avx2 = false;
  CHECK(cost::simd_layout(sandy)->fp32_flop_per_cycle() == 16);
  CHECK_FALSE(cost::simd_layout(cost::CpuFeatures{}));
}

TEST_CASE("the CPU peak is cores x lanes x FMA units x 2 FLOP x clock, bf16 from AVX512_BF16 or AMX", "[cost]") {
  const cost::CpuFeatures zen3 = cpu("AuthenticAMD", 0x19, 0x01);
  const cost::CpuClock clock{2.445406e9, "/proc/cpuinfo cpu MHz"};
  const cost::CpuPeak p = cost::cpu_peak(zen3, *cost::simd_layout(zen3), clock, 2, 2);
  CHECK(p.fp32 == Approx(2 * 8 * 2 * 2 * 2.445406e9).epsilon(1e-12));  // 156.5 GFLOP/s
  CHECK(p.bf16 == p.fp32);
  CHECK(p.fp16 == p.fp32);
  CHECK(p.bf16_source.find("fp32 peak applies") != std::string::npos);
  CHECK(p.formula().find("2 cores x 8 fp32 lanes (256-bit) x 2 FMA units x 2 FLOP x 2.445 GHz") != std::string::npos);
  CHECK(p.formula().find("156.5 GFLOP/s") != std::string::npos);

  cost::CpuFeatures genoa = cpu("AuthenticAMD", 0x19, 0x11, true);
  genoa.avx512_bf16 = true;
  const cost::CpuPeak g = cost::cpu_peak(genoa, *cost::simd_layout(genoa), {3.7e9, "sysfs cpuinfo_max_freq"}, 4, 4);
  CHECK(g.fp32 == Approx(4 * 8 * 2 * 2 * 3.7e9));
  CHECK(g.bf16 == Approx(2 * g.fp32));
  CHECK(g.fp16 == g.fp32);  // no AVX512_FP16

  cost::CpuFeatures spr = cpu("GenuineIntel", 6, 0x8f, true);
  spr.avx512_bf16 = spr.avx512_fp16 = spr.amx_bf16 = true;
  const cost::CpuPeak s = cost::cpu_peak(spr, *cost::simd_layout(spr), {3.8e9, "sysfs cpuinfo_max_freq"}, 8, 4);
  CHECK(s.cores == 4);  // threads past the physical cores add no FMA units
  CHECK(s.fp32 == Approx(4 * 16 * 2 * 2 * 3.8e9));
  CHECK(s.bf16 == Approx(4 * 1024 * 3.8e9));  // AMX-BF16 tiles
  CHECK(s.fp16 == Approx(2 * s.fp32));        // AVX512_FP16, no AMX-FP16
  CHECK(s.amx_bf16);

  // The CPU's hardware row: AMX is its tensor core; AVX512_BF16 alone is not.
  const cost::HardwareSpec hs = cost::cpu_hardware_spec(s, 100e9, 64e9);
  CHECK(hs.tensor_cores("bf16"));
  CHECK_FALSE(hs.tensor_cores("fp16"));
  CHECK(cost::roofline(hs, "bf16").gemm_flops_per_s == Approx(s.bf16));
  const cost::HardwareSpec hg = cost::cpu_hardware_spec(g, 50e9, 64e9);
  const cost::Roofline rg = cost::roofline(hg, "bf16");
  CHECK_FALSE(rg.tensor_cores);
  CHECK(rg.gemm_flops_per_s == Approx(g.bf16));
  CHECK(rg.other_flops_per_s == Approx(g.fp32));
  CHECK(rg.bandwidth == 50e9);
}

TEST_CASE("the CPU clock: sysfs cpuinfo_max_freq, else base_frequency, else /proc/cpuinfo cpu MHz", "[cost]") {
  const auto root = kiln::test::scratch_dir("cpu_clock");
  const auto sys = root / "sys";
  const auto info = root / "cpuinfo";
  write(info,
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu MHz\t\t: 2445.406\n\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu MHz\t\t: 2600.000\n\n"
        "processor\t: 2\ncpu MHz\t\t: 3100.000\n\n");
  // No cpufreq: the largest "cpu MHz" among the CPUs asked about.
  auto c = cost::read_cpu_clock({0, 1}, sys.string(), info.string());
  REQUIRE(c);
  CHECK(c->hz == Approx(2600e6));
  CHECK(c->source == "/proc/cpuinfo cpu MHz");
  CHECK(cost::read_cpu_clock({0}, sys.string(), info.string())->hz == Approx(2445.406e6));
  // base_frequency (kHz) wins over cpuinfo, cpuinfo_max_freq over both.
  write(sys / "cpu0/cpufreq/base_frequency", "2100000\n");
  c = cost::read_cpu_clock({0, 1}, sys.string(), info.string());
  CHECK(c->hz == Approx(2.1e9));
  CHECK(c->source == "sysfs base_frequency");
  write(sys / "cpu0/cpufreq/cpuinfo_max_freq", "3500000\n");
  write(sys / "cpu1/cpufreq/cpuinfo_max_freq", "3700000\n");
  c = cost::read_cpu_clock({0, 1}, sys.string(), info.string());
  CHECK(c->hz == Approx(3.7e9));
  CHECK(c->source == "sysfs cpuinfo_max_freq");
  CHECK_FALSE(cost::read_cpu_clock({0}, (root / "none").string(), (root / "none").string()));
}

TEST_CASE("the peak's clock: a measured one replaces /proc/cpuinfo's only when larger, never sysfs'", "[cost]") {
  // A VM without cpufreq: /proc/cpuinfo has the host's nominal clock, the measured boost is above.
  const cost::CpuClock proc{2.445e9, "/proc/cpuinfo cpu MHz"};
  cost::CpuClock c = cost::peak_clock(proc, 3.1e9);
  CHECK(c.hz == 3.1e9);
  CHECK(c.source == "measured (dependent-add chain), above /proc/cpuinfo cpu MHz");
  CHECK(c.reported_hz == 2.445e9);
  CHECK(c.reported_source == "/proc/cpuinfo cpu MHz");
  CHECK(c.measured_hz == 3.1e9);
  // Measured below (a throttled or preempted core): the reported clock stays, the larger one.
  c = cost::peak_clock(proc, 2.0e9);
  CHECK(c.hz == 2.445e9);
  CHECK(c.source == "/proc/cpuinfo cpu MHz");
  CHECK(c.measured_hz == 2.0e9);
  // sysfs cpufreq knows the boost clock: nothing is measured and nothing replaces it.
  for (const char* source : {"sysfs cpuinfo_max_freq", "sysfs base_frequency"}) {
    c = cost::peak_clock(cost::CpuClock{3.7e9, source}, 9e9);
    CHECK(c.hz == 3.7e9);
    CHECK(c.source == source);
    CHECK(c.measured_hz == 0);
  }
  // The formula names both clocks when the measured one is used.
  const cost::CpuFeatures f{"AuthenticAMD", 0x19, 0x01};
  const auto layout = cost::simd_layout(f);
  REQUIRE(!layout);  // no FMA flag set: no row
  cost::CpuFeatures zen3 = f;
  zen3.sse2 = zen3.avx = zen3.fma = zen3.avx2 = true;
  const auto p = cost::cpu_peak(zen3, *cost::simd_layout(zen3), cost::peak_clock(proc, 3.1e9), 2, 2);
  CHECK(p.fp32 == Approx(2 * 8 * 2 * 2 * 3.1e9));
  CHECK(p.formula().find("x 3.1 GHz (measured (dependent-add chain), above /proc/cpuinfo cpu MHz: 2.445 GHz)") !=
        std::string::npos);
}

TEST_CASE("the measured clock: a dependent-add chain gives this core's clock", "[cost]") {
  const auto hz = cost::measure_cpu_clock(20);
#if defined(__x86_64__)
  REQUIRE(hz);
  CHECK(*hz > 0.3e9);
  CHECK(*hz < 7e9);
  const auto reported = cost::read_cpu_clock(cost::allowed_cpus());
  REQUIRE(reported);
  if (reported->source == "sysfs cpuinfo_max_freq") {
    // cpufreq's maximum is the boost clock: the measured one stays within it (5% for timer noise).
    CHECK(*hz <= reported->hz * 1.05);
  }
  // The bound the peak exists for: one thread's best timed fp32 GEMM (512^3 at::mm, after a
  // warm-up) stays under one core's FMA FLOP per cycle x the peak's clock.
  const auto layout = cost::simd_layout(cost::read_cpu_features());
  REQUIRE(layout);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor a = at::randn({512, 512}), b = at::randn({512, 512});
  double best = 0;
  for (int i = 0; i < 12; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor c = at::mm(a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) best = std::max(best, 2.0 * 512 * 512 * 512 / s);
  }
  at::set_num_threads(threads);
  // The clock again after the GEMMs: a load that left meanwhile lets the turbo rise, and the
  // bound is the faster of the two readings (the profile measures once, well above its GEMM).
  const double clock = std::max(*hz, cost::measure_cpu_clock(20).value_or(0.0));
  const double peak = layout->fp32_flop_per_cycle() * cost::peak_clock(*reported, clock).hz;
  INFO("one thread's fp32 GEMM " << best / 1e9 << " GFLOP/s, one core's peak " << peak / 1e9 << " GFLOP/s");
  CHECK(best <= peak);
#else
  CHECK_FALSE(hz);
#endif
}

TEST_CASE("physical cores: SMT siblings count once", "[cost]") {
  const auto sys = kiln::test::scratch_dir("cpu_topology");
  // Four CPUs, two cores with two threads each, one package.
  for (int cpu = 0; cpu < 4; ++cpu) {
    write(sys / ("cpu" + std::to_string(cpu)) / "topology/physical_package_id", "0\n");
    write(sys / ("cpu" + std::to_string(cpu)) / "topology/core_id", std::to_string(cpu % 2) + "\n");
  }
  CHECK(cost::physical_cores({0, 1, 2, 3}, sys.string()) == 2);
  CHECK(cost::physical_cores({0, 2}, sys.string()) == 1);
  // A second package's core 0 is another core.
  write(sys / "cpu4/topology/physical_package_id", "1\n");
  write(sys / "cpu4/topology/core_id", "0\n");
  CHECK(cost::physical_cores({0, 4}, sys.string()) == 2);
  // No topology: every CPU a core.
  CHECK(cost::physical_cores({0, 1, 2}, (sys / "missing").string()) == 3);
}

TEST_CASE("this machine's CPU peak is the arithmetic of its own cpuid and clock", "[cost]") {
  std::string why;
  const auto p = cost::this_cpu_peak(&why);
  const cost::CpuFeatures f = cost::read_cpu_features();
  if (!p) {
    CHECK_FALSE(why.empty());
    SUCCEED("no theoretical peak here: " + why);
    return;
  }
  const auto layout = cost::simd_layout(f);
  REQUIRE(layout);
  const auto reported = cost::read_cpu_clock(cost::allowed_cpus());
  REQUIRE(reported);
  // The clock is the reported one, or (no cpufreq) a measured one above it.
  CHECK(p->clock.reported_hz == reported->hz);
  CHECK(p->clock.reported_source == reported->source);
  if (reported->source == "/proc/cpuinfo cpu MHz") {
    CHECK(p->clock.measured_hz > 0);
    CHECK(p->clock.hz == std::max(reported->hz, p->clock.measured_hz));
  } else {
    CHECK(p->clock.hz == reported->hz);
  }
  const auto* clock = &p->clock;
  CHECK(p->cores >= 1);
  CHECK(p->cores <= p->threads);
  CHECK(p->fp32 ==
        Approx(p->cores * (layout->width_bits / 32) * layout->units * layout->flop_per_instruction * clock->hz));
  CHECK(p->bf16 >= p->fp32);
  // The device peak MFU divides by on the CPU is this one.
  const auto peak = cost::device_peak(at::Device(at::kCPU), at::kFloat);
  REQUIRE(peak);
  CHECK(peak->source == "theoretical");
  CHECK(peak->tflops == Approx(p->fp32 / 1e12));
}

TEST_CASE("a fraction of a peak above 100% is reported as a bug, at or below it is not", "[cost]") {
  CHECK_FALSE(cost::peak_violation(0.0, "MFU", "x"));
  CHECK_FALSE(cost::peak_violation(0.37, "MFU", "x"));
  CHECK_FALSE(cost::peak_violation(1.0, "MFU", "x"));
  CHECK_FALSE(cost::peak_violation(std::nan(""), "MFU", "x"));
  const auto bug = cost::peak_violation(1.042, "MFU at cutoff_len 16", "the fp32 peak of 0.1565 TFLOP/s");
  REQUIRE(bug);
  CHECK(bug->rfind("BUG: MFU at cutoff_len 16 104.2% exceeds 100% of the fp32 peak of 0.1565 TFLOP/s", 0) == 0);
}

TEST_CASE("the GPU table has tensor and non-tensor peaks per dtype from the data sheets", "[cost]") {
  struct Sheet {
    const char* name;
    double bf16, fp16, fp32, bf16_vector, fp16_vector, tf32;
    bool tensor_bf16;
  };
  // The data sheets' dense figures (V100/A100/H100/H200 SXM, V100/A100/H100 PCIe) and the
  // whitepapers' non-tensor ones (twice FP32 on V100 and H100; a PCIe card's by that ratio).
  const Sheet sheets[] = {
      {"V100-32GB", 15.7, 125, 15.7, 15.7, 31.4, 0, false},   {"V100-PCIe-16GB", 14, 112, 14, 14, 28, 0, false},
      {"A100-80GB", 312, 312, 19.5, 39, 78, 156, true},       {"A100-PCIe-80GB", 312, 312, 19.5, 39, 78, 156, true},
      {"H100-80GB", 989, 989, 67, 133.8, 133.8, 494.5, true}, {"H100-PCIe-80GB", 756, 756, 51, 102, 102, 378, true},
      {"H200-141GB", 989, 989, 67, 133.8, 133.8, 494.5, true}};
  for (const Sheet& s : sheets) {
    CAPTURE(s.name);
    const auto h = cost::hardware_spec(s.name);
    REQUIRE(h);
    CHECK(h->peak_tflops("bf16") == s.bf16);
    CHECK(h->peak_tflops("fp16") == s.fp16);
    CHECK(h->peak_tflops("fp32") == s.fp32);
    CHECK(h->bf16_vector == s.bf16_vector);
    CHECK(h->fp16_vector == s.fp16_vector);
    CHECK(h->tf32 == s.tf32);
    CHECK(h->tensor_cores("bf16") == s.tensor_bf16);
    CHECK(h->tensor_cores("fp16"));
    CHECK_FALSE(h->tensor_cores("fp32"));
    CHECK(cost::roofline(*h, "bf16").tensor_cores == s.tensor_bf16);
    CHECK(h->source.find("datasheet") == 0);
  }
  for (const auto& h : cost::hardware_specs()) {
    CAPTURE(h.name);
    CHECK(h.fp32 > 0);
    CHECK(h.bf16_vector > 0);
    CHECK(h.fp16_vector > 0);
    CHECK(h.memory_bandwidth > 0);
  }
}

TEST_CASE("modelled utilisation without tensor cores puts every FLOP on the vector units at their rates", "[cost]") {
  const auto h = *cost::hardware_spec("V100-32GB");
  cost::TrafficReport r;
  cost::TrafficRow row;
  row.component = "q_proj";
  row.repeats = 1;
  row.kiln = {8e12, 1e12, 2e9};
  r.rows.push_back(row);
  cost::Roofline roof = cost::roofline(h, "bf16");
  roof.gemm_flops_per_s = 2 * roof.other_flops_per_s;  // a CPU with AVX512_BF16: bf16 GEMMs at twice fp32's rate
  const auto u = cost::modelled_utilisation(r, roof, 1.0);
  CHECK(u.tensor_core == 0);
  CHECK(u.fp_engine == Approx(8e12 / roof.gemm_flops_per_s + 1e12 / roof.other_flops_per_s));
  CHECK(u.memory_bandwidth == Approx(2e9 / 900e9));
}

TEST_CASE("the CPU copy bandwidth is measured and positive", "[cost]") {
  const double b = kiln::device::measure_cpu_copy_bandwidth();
  CHECK(b > 1e8);   // any CPU moves more than 0.1 GB/s
  CHECK(b < 2e12);  // and less than 2 TB/s through one socket
}
