// The CPU's theoretical peak, the denominator of MFU on a CPU (docs/performance.md, "Peaks"):
//
//   FLOP/s = cores used x fp32 lanes (FMA datapath width / 32) x FMA units per core
//            x FLOP per instruction (2 for a fused multiply-add) x clock
//
// The instruction-set flags come from cpuid (<cpuid.h>: FMA, AVX, AVX2, AVX-512F, AVX512_BF16,
// AVX512_FP16, AMX-BF16, AMX-FP16; the OS must enable the register state, XCR0). The datapath
// width and FMA units per core cpuid does not report: they come from a table by vendor, family and
// model (simd_layout below), which says which row it used. Where the table cannot tell (Intel's
// Xeon Silver/Bronze and some Gold 5xxx have one 512-bit FMA unit, the others two) it takes the
// larger figure, so that the peak stays an upper bound. The clock is the largest of the CPUs'
// sysfs cpufreq/cpuinfo_max_freq (boost included), else their base_frequency, else /proc/cpuinfo's
// "cpu MHz". A VM without cpufreq reports there the host's nominal clock (its TSC rate), which
// boost exceeds: a 2-core AMD Zen 3 guest reads 2.445 GHz while its GEMMs run at 2.6+ GHz, so a
// peak from it is no upper bound. There (and only there) the clock is also measured, a chain of
// dependent register adds timed on one core (measure_cpu_clock), and the larger of the two is
// used: one core's boost is the most any core runs at. Cores
// used are LibTorch's threads, at most the physical cores of the CPUs the process may run on
// (SMT siblings share one core's FMA units).
//
// bf16/fp16: AMX tiles (1024 FLOP per cycle per core, Intel's TMUL: one 16x32 by 32x16 tile
// product per 16 cycles) where AMX-BF16/AMX-FP16 exist; AVX512_BF16 (VDPBF16PS: two bf16 products
// per fp32 lane) and AVX512_FP16 (32 fp16 lanes) at twice the fp32 rate; otherwise the fp32 peak
// applies (bf16/fp16 GEMMs convert to fp32 on such CPUs).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/cost/hardware.h"

namespace kiln::cost {

struct CpuFeatures {
  std::string vendor;         // "AuthenticAMD", "GenuineIntel", ... (cpuid leaf 0)
  int family = 0, model = 0;  // display family and model (base + extended fields, cpuid leaf 1)
  std::string model_name;     // the brand string (cpuid 0x80000002-4)
  bool sse2 = false, avx = false, fma = false, avx2 = false, avx512f = false;
  bool avx512_bf16 = false, avx512_fp16 = false, amx_bf16 = false, amx_fp16 = false;
};

// This CPU's cpuid; all false (and an empty vendor) on a non-x86 CPU.
CpuFeatures read_cpu_features();

// The per-core fp32 FMA datapath: vector width in bits, FMA units (or add + multiply pipes
// without FMA) and FLOP per instruction; `row` names the table row ("AMD Zen 3 (family 0x19)").
struct SimdLayout {
  int width_bits = 0;
  int units = 0;
  int flop_per_instruction = 0;  // 2 for an FMA, 1 for separate add and multiply pipes
  std::string row;
  int fp32_flop_per_cycle() const { return width_bits / 32 * units * flop_per_instruction; }
};
// The table; nullopt for a CPU it has no row for (not x86, or no SSE2).
std::optional<SimdLayout> simd_layout(const CpuFeatures& features);

struct CpuClock {
  double hz = 0;
  // "sysfs cpuinfo_max_freq", "sysfs base_frequency", "/proc/cpuinfo cpu MHz", or
  // "measured (dependent-add chain), above /proc/cpuinfo cpu MHz"
  std::string source;
  double reported_hz = 0;       // what sysfs or /proc/cpuinfo says (= hz unless measured above it)
  std::string reported_source;  // its source
  double measured_hz = 0;       // measure_cpu_clock's, where it ran (no cpufreq); 0 otherwise
};
// The clock of `cpus` (ids as in /sys/devices/system/cpu/cpuN); the roots are parameters for the
// tests. nullopt when none of the three sources has a number.
std::optional<CpuClock> read_cpu_clock(const std::vector<int>& cpus,
                                       const std::string& sysfs_root = "/sys/devices/system/cpu",
                                       const std::string& cpuinfo = "/proc/cpuinfo");
// This core's clock, measured: the fastest of `trials` timings of a chain of dependent 64-bit
// register adds (one per cycle on every x86-64 core: reg+reg adds are never eliminated at rename),
// after a warm-up that lets the clock ramp up. A preempted trial only reads slower, so the fastest
// is the clock. nullopt where not x86-64.
std::optional<double> measure_cpu_clock(int trials = 40);
// read_cpu_clock's, raised to measure_cpu_clock's where the reported figure is /proc/cpuinfo's
// (no cpufreq) and the measured one is larger; `measured` is for the tests (nullopt: measure).
CpuClock peak_clock(const CpuClock& reported, std::optional<double> measured = std::nullopt);
// Physical cores among `cpus`: distinct (physical_package_id, core_id) of their sysfs topology; the
// number of CPUs where the topology is missing.
int physical_cores(const std::vector<int>& cpus, const std::string& sysfs_root = "/sys/devices/system/cpu");
// The CPUs this process may run on (sched_getaffinity).
std::vector<int> allowed_cpus();

struct CpuPeak {
  CpuFeatures features;
  SimdLayout layout;
  CpuClock clock;
  int threads = 0;                               // LibTorch's intra-op threads
  int cores = 0;                                 // cores used: min(threads, physical cores)
  double fp32 = 0, bf16 = 0, fp16 = 0;           // FLOP/s
  std::string bf16_source, fp16_source;          // "AMX-BF16: 1024 FLOP/cycle/core", "fp32 peak applies (...)"
  bool amx_bf16 = false, amx_fp16 = false;       // the bf16/fp16 peak is a matrix unit's (the CPU's "tensor core")
  double flops(const std::string& dtype) const;  // "bf16" | "fp16" | "fp32"
  // "2 cores x 8 fp32 lanes (256-bit) x 2 FMA units x 2 FLOP x 2.445 GHz (/proc/cpuinfo cpu MHz)
  // = 156.5 GFLOP/s"
  std::string formula() const;
};

// The arithmetic, from its inputs.
CpuPeak cpu_peak(const CpuFeatures& features, const SimdLayout& layout, const CpuClock& clock, int threads, int cores);
// This machine's, for LibTorch's current thread count; nullopt (with the reason in `why`) where
// the table has no row or no clock is readable.
std::optional<CpuPeak> this_cpu_peak(std::string* why = nullptr);

// A hardware row for the CPU's roofline: the theoretical peaks, `bandwidth` bytes/s (measured:
// device::measure_cpu_copy_bandwidth), the machine's RAM. Its "tensor cores" are AMX tiles.
HardwareSpec cpu_hardware_spec(const CpuPeak& peak, double bandwidth, double memory_bytes);

// This machine's device as a roofline sees it, one rule for kiln-profile's sweep and explain: a
// GPU's row of the hardware table (none where the table lacks it), or the CPU's theoretical peaks
// with its measured copy bandwidth (none without a theoretical peak: cpu_peak_missing says why).
struct MachineHardware {
  std::optional<HardwareSpec> spec;
  std::string bandwidth_source;  // the data sheet's, or the measurement's
  std::optional<CpuPeak> cpu_peak;
  std::string cpu_peak_missing;
};
MachineHardware machine_hardware(const at::Device& device);

}  // namespace kiln::cost
