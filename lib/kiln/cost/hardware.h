// The hardware table: every GPU kiln plans for and reports MFU against, once (the planner, the
// trainer's MFU, kiln-profile). Dense peaks (no sparsity) and memory bandwidth from NVIDIA's
// data sheets for the SXM parts (PCIe parts are lower: pass --peak-tflops); memory as sold
// (GB = 1e9, NVIDIA's "80GB"). V100 has no bf16 tensor cores: bf16 runs on its FP32 units.
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
  double memory_bytes = 0;
  double bf16 = 0, fp16 = 0, fp32 = 0;  // dense TFLOP/s: tensor cores for bf16/fp16, FP32 units for fp32
  double memory_bandwidth = 0;          // bytes/s (HBM)
  // "bf16" | "fp16" | "fp32"
  double peak_tflops(const std::string& dtype) const;
  double peak_tflops(at::ScalarType dtype) const;
};

const std::vector<HardwareSpec>& hardware_specs();
// By the planner's name ("V100-16GB", "A100-80GB", "H200-141GB", case-insensitive).
std::optional<HardwareSpec> hardware_spec(const std::string& name);
// By the name CUDA reports ("NVIDIA A100-SXM4-80GB"): the first row of its family (all memory
// sizes of a family have the same peaks); nullopt for a GPU the table does not know.
std::optional<HardwareSpec> hardware_for_device_name(const std::string& device_name);

struct DevicePeak {
  std::string name;    // "NVIDIA H200", "CPU (2 threads)"
  double tflops = 0;   // peak for the dtype asked for
  std::string source;  // "datasheet" or "measured"
};

// Peak dense TFLOP/s of a GPU by its reported name for `dtype`; nullopt for an unknown GPU.
std::optional<DevicePeak> gpu_peak(const std::string& device_name, at::ScalarType dtype);
// The peak for `device`: the table for a CUDA device, a measured fp32 GEMM rate on the CPU
// (common/device.h).
std::optional<DevicePeak> device_peak(const at::Device& device, at::ScalarType dtype);

}  // namespace kiln::cost
