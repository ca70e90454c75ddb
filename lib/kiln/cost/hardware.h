// The hardware table: every GPU kiln plans for and reports MFU against, once (the planner, the
// trainer's MFU, kiln-profile). Dense peaks (no sparsity) and memory bandwidth from NVIDIA's
// data sheets, SXM and PCIe parts apart (a GPU the table lacks: pass --peak-tflops); memory as sold
// (GB = 1e9, NVIDIA's "80GB"). V100 has no bf16 tensor cores: bf16 runs on its FP32 units.
// Each dtype has a tensor-core (matrix) peak and a non-tensor (vector, "fp engine") peak; the CPU's
// row is built from cpuid and sysfs (cost/cpu_peak.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace kiln::cost {

struct HardwareSpec {
  std::string name;    // "A100-80GB": the planner's name (--device, auto_fit)
  std::string family;  // "A100": matched in the CUDA device's reported name
  bool pcie = false;   // a PCIe card (lower clocks than the SXM module of the same chip)
  double memory_bytes = 0;
  // Dense TFLOP/s of a GEMM in each dtype: the tensor cores for bf16/fp16 where the part has them
  // (tensor_bf16, tensor_fp16), the FP32 units for fp32 (kiln leaves TF32 off).
  double bf16 = 0, fp16 = 0, fp32 = 0;
  double memory_bandwidth = 0;  // bytes/s (HBM)
  // The L2 cache in bytes (NVIDIA's "MB" is MiB here: the Volta whitepaper's "6144 KB"), from the
  // architecture whitepapers; 0 = unknown or none modelled (the CPU's row): the traffic model adds
  // no GEMM re-read term for it (cost/traffic.h, GemmDram).
  double l2_bytes = 0;
  double sms = 0;  // streaming multiprocessors (0: not a GPU)
  // Non-tensor ("vector") dense TFLOP/s of bf16/fp16 arithmetic on the SM's FP units, and the
  // tensor cores' TF32 (not used for MFU: torch's allow_tf32 is off for matmuls by default).
  double bf16_vector = 0, fp16_vector = 0, tf32 = 0;
  bool tensor_bf16 = true, tensor_fp16 = true;  // bf16 / fp16 above are tensor-core peaks
  std::string source;                           // where the numbers come from
  // "bf16" | "fp16" | "fp32"
  double peak_tflops(const std::string& dtype) const;
  double peak_tflops(at::ScalarType dtype) const;
  // Whether a GEMM in `dtype` runs on the tensor cores (never fp32).
  bool tensor_cores(const std::string& dtype) const;
};

const std::vector<HardwareSpec>& hardware_specs();
// By the planner's name ("V100-16GB", "A100-80GB", "H200-141GB", case-insensitive).
std::optional<HardwareSpec> hardware_spec(const std::string& name);
// By the name CUDA reports ("NVIDIA A100-SXM4-80GB"): among its family's rows of the same form
// factor ("PCIe" in the name, else SXM), the one whose memory is nearest the size the name gives
// ("80GB"), else `memory_bytes` (what the device reports, e.g. cudaDeviceProp::totalGlobalMem),
// else the first. The peaks depend on the family and form factor, the bandwidth also on the memory
// (an A100-80GB moves 2,039 GB/s, a 40GB one 1,555); nullopt for a GPU the table does not know.
std::optional<HardwareSpec> hardware_for_device_name(const std::string& device_name, double memory_bytes = 0);

struct DevicePeak {
  std::string name;    // "NVIDIA H200", "CPU (2 threads)"
  double tflops = 0;   // peak for the dtype asked for
  std::string source;  // "datasheet", "theoretical" (the CPU's, cost/cpu_peak.h) or "measured"
};

// Peak dense TFLOP/s of a GPU by its reported name for `dtype`; nullopt for an unknown GPU.
std::optional<DevicePeak> gpu_peak(const std::string& device_name, at::ScalarType dtype);
// The peak for `device`: the table for a CUDA device; on the CPU the theoretical peak from cpuid
// and sysfs (cost/cpu_peak.h), or, for a CPU the table has no row for, a measured fp32 GEMM rate
// (common/device.h), which a faster later moment can exceed.
std::optional<DevicePeak> device_peak(const at::Device& device, at::ScalarType dtype);

// A fraction of a peak (MFU, a counter's or the model's utilisation) above 1 means the peak does
// not hold or the measurement is wrong: a bug to report, never to hide or clamp. Returns the
// line to report ("BUG: MFU 104.2% exceeds 100% of ..."), nullopt for a fraction within [0, 1].
// `what` names the quantity, `peak` says what it is a fraction of.
std::optional<std::string> peak_violation(double fraction, const std::string& what, const std::string& peak);

}  // namespace kiln::cost
