// The CPU's theoretical peak (cpu_peak.h): cpuid, the FMA table, the clock and the cores.
#include "kiln/cost/cpu_peak.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include <sched.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "kiln/common/device.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln::cost {

CpuFeatures read_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  const int base_family = static_cast<int>((a >> 8) & 0xf), base_model = static_cast<int>((a >> 4) & 0xf);
  f.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xff) : base_family;
  f.model =
      base_family == 0x6 || base_family == 0xf ? base_model + (static_cast<int>((a >> 16) & 0xf) << 4) : base_model;
  f.sse2 = (d >> 26) & 1;
  // The OS must save the wider registers (XCR0): YMM state (bits 1, 2) for AVX, opmask and ZMM
  // (5, 6, 7) for AVX-512, the tile config and data (17, 18) for AMX.
  uint64_t xcr0 = 0;
  if ((c >> 27) & 1) {  // OSXSAVE
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = ymm && (xcr0 & 0xe0) == 0xe0, tiles = (xcr0 & 0x60000) == 0x60000;
  f.avx = ymm && ((c >> 28) & 1);
  f.fma = f.avx && ((c >> 12) & 1);
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    const unsigned max_sub = a;
    f.avx2 = f.avx && ((b >> 5) & 1);
    f.avx512f = zmm && ((b >> 16) & 1);
    f.avx512_fp16 = f.avx512f && ((d >> 23) & 1);
    f.amx_bf16 = tiles && ((d >> 22) & 1);
    if (max_sub >= 1) {
      __get_cpuid_count(7, 1, &a, &b, &c, &d);
      f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
      f.amx_fp16 = tiles && ((a >> 21) & 1);
    }
  }
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &a, &b, &c, &d);
      std::memcpy(brand + 16 * leaf, &a, 4);
      std::memcpy(brand + 16 * leaf + 4, &b, 4);
      std::memcpy(brand + 16 * leaf + 8, &c, 4);
      std::memcpy(brand + 16 * leaf + 12, &d, 4);
    }
    f.model_name = brand;
    f.model_name.erase(0, f.model_name.find_first_not_of(' '));
    f.model_name.erase(f.model_name.find_last_not_of(' ') + 1);
  }
#endif
  return f;
}

// The table. Sources: AMD's Software Optimization Guides for family 17h (Zen: four 128-bit FP
// pipes, two of them FMA; Zen 2: 256-bit), 19h (Zen 3 and Zen 4: two 256-bit FMA pipes; Zen 4
// executes AVX-512 as two 256-bit halves) and 1Ah (Zen 5: two 512-bit FMA pipes, 256-bit in the
// mobile parts); Intel's Optimization Reference Manual (Haswell to the hybrid cores: two 256-bit
// FMA ports 0 and 1; Xeon Scalable: the fused port 0+1 512-bit unit and port 5's; Ice Lake, Tiger
// Lake and Rocket Lake clients: the fused unit only).
std::optional<SimdLayout> simd_layout(const CpuFeatures& f) {
  auto row = [&](int width, int units, const std::string& what) {
    return SimdLayout{width, units, 2,
                      fmt::format("{} (table: {} family 0x{:x} model 0x{:x})", what, f.vendor, f.family, f.model)};
  };
  const bool amd = f.vendor == "AuthenticAMD" || f.vendor == "HygonGenuine";
  const bool intel = f.vendor == "GenuineIntel";
  if (f.fma) {
    if (amd) {
      if (f.family == 0x17 && f.model < 0x30) return row(128, 2, "AMD Zen/Zen+: 2 x 128-bit FMA");
      if (f.family == 0x18) return row(128, 2, "Hygon Dhyana (Zen): 2 x 128-bit FMA");
      if (f.family == 0x17) return row(256, 2, "AMD Zen 2: 2 x 256-bit FMA");
      if (f.family == 0x19) {
        const bool zen4 = (f.model >= 0x10 && f.model <= 0x1f) || (f.model >= 0x60 && f.model <= 0x7f) ||
                          (f.model >= 0xa0 && f.model <= 0xaf);
        return row(256, 2, zen4 ? "AMD Zen 4: 2 x 256-bit FMA (AVX-512 in two halves)" : "AMD Zen 3: 2 x 256-bit FMA");
      }
      if (f.family == 0x1a) {
        const bool mobile = (f.model >= 0x20 && f.model <= 0x2f) || (f.model >= 0x60 && f.model <= 0x6f);
        return mobile ? row(256, 2, "AMD Zen 5 mobile: 2 x 256-bit FMA (AVX-512 in two halves)")
                      : row(512, 2, "AMD Zen 5: 2 x 512-bit FMA");
      }
    }
    // AMX or AVX512_FP16: a Xeon from Sapphire Rapids on (2 x 512-bit FMA), whatever model number
    // the hypervisor shows: a cloud guest of this project's reads model 0xa7 (Rocket Lake, a client
    // with one 512-bit unit) beside AMX, and a single thread's GEMM ran at 64 FLOP per cycle.
    if (intel && f.avx512f && (f.amx_bf16 || f.amx_fp16 || f.avx512_fp16))
      return row(512, 2, "Intel Xeon with AMX/AVX512_FP16 (Sapphire Rapids and later): 2 x 512-bit FMA");
    if (intel && f.family == 6 && f.avx512f) {
      static const std::set<int> client = {0x66, 0x7d, 0x7e, 0x8c, 0x8d, 0xa7};
      if (client.count(f.model)) return row(512, 1, "Intel Ice/Tiger/Rocket Lake client: 1 x 512-bit FMA");
      static const std::set<int> server = {0x55, 0x6a, 0x6c, 0x8f, 0xcf, 0xad, 0xae, 0x57, 0x85};
      if (server.count(f.model))
        return row(512, 2, "Intel Xeon with AVX-512: 2 x 512-bit FMA (1 on some Silver/Bronze/Gold 5xxx: upper bound)");
    }
    if (intel && f.family == 6 && !f.avx512f) return row(256, 2, "Intel with AVX2/FMA: 2 x 256-bit FMA");
    // No row: the widest the flags allow with two FMA units, an upper bound.
    if (f.avx512f) return row(512, 2, "unknown CPU with AVX-512: assumed 2 x 512-bit FMA (upper bound)");
    return row(256, 2, "unknown CPU with FMA: assumed 2 x 256-bit FMA (upper bound)");
  }
  // No FMA: one add and one multiply pipe per core at the vector width.
  if (f.avx) {
    return SimdLayout{256, 2, 1,
                      fmt::format("AVX without FMA: one 256-bit add + one 256-bit multiply pipe ({} family 0x{:x} "
                                  "model 0x{:x})",
                                  f.vendor, f.family, f.model)};
  }
  if (f.sse2) return SimdLayout{128, 2, 1, "SSE2: one 128-bit add + one 128-bit multiply pipe"};
  return std::nullopt;
}

namespace {

std::optional<double> read_number(const std::string& path) {
  std::ifstream in(path);
  double v = 0;
  if (in >> v && v > 0) return v;
  return std::nullopt;
}

// A clock as sysfs or /proc/cpuinfo gives it (peak_clock fills the reported and measured fields).
CpuClock reported_clock(double hz, std::string source) {
  CpuClock c;
  c.hz = hz;
  c.source = std::move(source);
  return c;
}

}  // namespace

std::optional<CpuClock> read_cpu_clock(const std::vector<int>& cpus, const std::string& sysfs_root,
                                       const std::string& cpuinfo) {
  // sysfs cpufreq reports kHz.
  for (const char* file : {"cpuinfo_max_freq", "base_frequency"}) {
    double best = 0;
    for (int cpu : cpus) {
      if (const auto khz = read_number(fmt::format("{}/cpu{}/cpufreq/{}", sysfs_root, cpu, file)))
        best = std::max(best, *khz * 1e3);
    }
    if (best > 0) return reported_clock(best, std::string("sysfs ") + file);
  }
  // /proc/cpuinfo: "processor : N" opens each CPU's block, "cpu MHz : 2445.406" in it.
  std::ifstream in(cpuinfo);
  std::string line;
  int processor = -1;
  double best = 0;
  const std::set<int> wanted(cpus.begin(), cpus.end());
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key == "processor") {
      processor = std::atoi(line.c_str() + colon + 1);
    } else if (key == "cpu MHz" && (wanted.empty() || wanted.count(processor))) {
      best = std::max(best, std::atof(line.c_str() + colon + 1) * 1e6);
    }
  }
  if (best > 0) return reported_clock(best, "/proc/cpuinfo cpu MHz");
  return std::nullopt;
}

std::optional<double> measure_cpu_clock(int trials) {
#if defined(__x86_64__)
  // One timing: `iterations` x 100 dependent adds (the loop counter's dec/jnz run beside them).
  auto chain = [](uint64_t iterations) {
    uint64_t a = 0, count = iterations;
    const uint64_t b = 1;
    const auto t0 = std::chrono::steady_clock::now();
    asm volatile(
        "1:\n\t"
        ".rept 100\n\t"
        "add %[b], %[a]\n\t"
        ".endr\n\t"
        "dec %[count]\n\t"
        "jnz 1b\n\t"
        : [a] "+r"(a), [count] "+r"(count)
        : [b] "r"(b)
        : "cc");
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(t1 - t0).count();
  };
  constexpr uint64_t kIterations = 10000;  // 1M adds: about 0.3 ms at 3.5 GHz, inside a time slice
  // Warm-up: about 20 ms of work, so that a clock ramping up from idle is at its top.
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (std::chrono::steady_clock::now() < warm_until) chain(kIterations);
  double best = 0;
  for (int i = 0; i < std::max(1, trials); ++i) {
    const double seconds = chain(kIterations);
    if (seconds > 0) best = std::max(best, static_cast<double>(kIterations) * 100 / seconds);
  }
  if (best > 0) return best;
#else
  (void)trials;
#endif
  return std::nullopt;
}

CpuClock peak_clock(const CpuClock& reported, std::optional<double> measured) {
  CpuClock c = reported;
  c.reported_hz = reported.hz;
  c.reported_source = reported.source;
  if (reported.source != "/proc/cpuinfo cpu MHz") return c;  // cpufreq knows the boost clock
  if (!measured) measured = measure_cpu_clock();
  if (!measured) return c;
  c.measured_hz = *measured;
  if (*measured > reported.hz) {
    c.hz = *measured;
    c.source = "measured (dependent-add chain), above /proc/cpuinfo cpu MHz";
  }
  return c;
}

int physical_cores(const std::vector<int>& cpus, const std::string& sysfs_root) {
  std::set<std::pair<long, long>> cores;
  for (int cpu : cpus) {
    const auto package = read_number(fmt::format("{}/cpu{}/topology/physical_package_id", sysfs_root, cpu));
    std::ifstream in(fmt::format("{}/cpu{}/topology/core_id", sysfs_root, cpu));
    long core = 0;
    if (!(in >> core)) return static_cast<int>(cpus.size());
    // physical_package_id 0 reads as "no number" above; 0 is the package then.
    cores.insert({package ? static_cast<long>(*package) : 0L, core});
  }
  return static_cast<int>(cores.size());
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) out.push_back(i);
  }
  return out;
}

double CpuPeak::flops(const std::string& dtype) const {
  return dtype == "bf16" ? bf16 : dtype == "fp16" ? fp16 : fp32;
}

std::string CpuPeak::formula() const {
  return fmt::format("{} core{} x {} fp32 lanes ({}-bit) x {} {} x {} FLOP x {:.4g} GHz ({}) = {:.4g} GFLOP/s", cores,
                     cores == 1 ? "" : "s", layout.width_bits / 32, layout.width_bits, layout.units,
                     layout.flop_per_instruction == 2 ? "FMA units" : "pipes (add, multiply)",
                     layout.flop_per_instruction, clock.hz / 1e9,
                     clock.hz != clock.reported_hz && clock.reported_hz > 0
                         ? fmt::format("{}: {:.4g} GHz", clock.source, clock.reported_hz / 1e9)
                         : clock.source,
                     fp32 / 1e9);
}

CpuPeak cpu_peak(const CpuFeatures& features, const SimdLayout& layout, const CpuClock& clock, int threads, int cores) {
  CpuPeak p;
  p.features = features;
  p.layout = layout;
  p.clock = clock;
  p.threads = threads;
  p.cores = cores;
  p.fp32 = static_cast<double>(cores) * layout.fp32_flop_per_cycle() * clock.hz;
  // AMX: one TDPBF16PS/TDPFP16PS (16 x 16 x 32 multiply-adds) per 16 cycles per core.
  constexpr double kAmxFlopPerCycle = 1024;
  auto low = [&](bool amx, bool avx512, const char* amx_name, const char* avx_name, double& out, std::string& source) {
    if (amx) {
      out = cores * kAmxFlopPerCycle * clock.hz;
      source = fmt::format("{}: {} FLOP/cycle/core (AMX tiles)", amx_name, kAmxFlopPerCycle);
    } else if (avx512) {
      out = 2 * p.fp32;
      source = fmt::format("{}: twice the fp32 rate (two products per fp32 lane)", avx_name);
    } else {
      out = p.fp32;
      source = fmt::format("fp32 peak applies: no {} or {}, low-precision GEMMs run through fp32", avx_name, amx_name);
    }
  };
  low(features.amx_bf16, features.avx512_bf16, "AMX-BF16", "AVX512_BF16", p.bf16, p.bf16_source);
  low(features.amx_fp16, features.avx512_fp16, "AMX-FP16", "AVX512_FP16", p.fp16, p.fp16_source);
  p.amx_bf16 = features.amx_bf16;
  p.amx_fp16 = features.amx_fp16;
  return p;
}

std::optional<CpuPeak> this_cpu_peak(std::string* why) {
  const CpuFeatures features = read_cpu_features();
  const auto layout = simd_layout(features);
  if (!layout) {
    if (why) *why = "no FMA table row for this CPU (not x86, or no SSE2)";
    return std::nullopt;
  }
  std::vector<int> cpus = allowed_cpus();
  const auto reported = read_cpu_clock(cpus);
  if (!reported) {
    if (why) *why = "no clock in sysfs cpufreq or /proc/cpuinfo";
    return std::nullopt;
  }
  // Measured once per process (about 35 ms); the clock does not change between calls.
  static const CpuClock measured_clock = peak_clock(*reported);
  const CpuClock clock = measured_clock.reported_hz == reported->hz ? measured_clock : peak_clock(*reported);
  const int threads = at::get_num_threads();
  const int physical = cpus.empty() ? threads : physical_cores(cpus);
  return cpu_peak(features, *layout, clock, threads, std::max(1, std::min(threads, physical)));
}

HardwareSpec cpu_hardware_spec(const CpuPeak& peak, double bandwidth, double memory_bytes) {
  HardwareSpec h;
  h.name = fmt::format("CPU ({} threads)", peak.threads);
  h.family = "CPU";
  h.memory_bytes = memory_bytes;
  h.fp32 = peak.fp32 / 1e12;
  h.bf16 = peak.bf16 / 1e12;
  h.fp16 = peak.fp16 / 1e12;
  h.memory_bandwidth = bandwidth;
  // Off the matrix unit, bf16/fp16 run at the AVX-512 rates (or fp32's).
  h.bf16_vector = peak.amx_bf16 ? (peak.features.avx512_bf16 ? 2 * peak.fp32 : peak.fp32) / 1e12 : h.bf16;
  h.fp16_vector = peak.amx_fp16 ? (peak.features.avx512_fp16 ? 2 * peak.fp32 : peak.fp32) / 1e12 : h.fp16;
  h.tensor_bf16 = peak.amx_bf16;
  h.tensor_fp16 = peak.amx_fp16;
  h.source = "theoretical: " + peak.formula();
  return h;
}

MachineHardware machine_hardware(const at::Device& device) {
  MachineHardware m;
  if (device.is_cuda()) {
    m.spec = hardware_for_device_name(device::name(device), device::device_memory_bytes(device));
    if (m.spec) m.bandwidth_source = m.spec->source;
    return m;
  }
  m.cpu_peak = this_cpu_peak(&m.cpu_peak_missing);
  const double bandwidth = device::measure_cpu_copy_bandwidth();
  m.bandwidth_source = fmt::format("measured: STREAM-like copy of 64 MiB fp32 with {} threads, best of 5, {:.1f} GB/s",
                                   at::get_num_threads(), bandwidth / 1e9);
  if (m.cpu_peak) m.spec = cpu_hardware_spec(*m.cpu_peak, bandwidth, device::device_memory_bytes(device));
  return m;
}

}  // namespace kiln::cost
