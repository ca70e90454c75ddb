#include "kiln/cost/hardware.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>

#include <fmt/format.h>

#include "kiln/common/device.h"
#include "kiln/common/dtype_names.h"
#include "kiln/cost/cpu_peak.h"

namespace kiln::cost {

double HardwareSpec::peak_tflops(const std::string& dtype) const {
  return dtype == "bf16" ? bf16 : dtype == "fp16" ? fp16 : fp32;
}

double HardwareSpec::peak_tflops(at::ScalarType dtype) const {
  return dtype == at::kBFloat16 ? bf16 : dtype == at::kHalf ? fp16 : fp32;
}

bool HardwareSpec::tensor_cores(const std::string& dtype) const {
  return dtype == "bf16" ? tensor_bf16 : dtype == "fp16" ? tensor_fp16 : false;
}

const std::vector<HardwareSpec>& hardware_specs() {
  // Dense TFLOP/s (no 2:4 sparsity) at the part's boost clock; SXM and PCIe parts apart (a PCIe
  // card runs the same chip at a lower clock and power).
  //   V100: NVIDIA Tesla V100 data sheet (SXM2: 15.7 FP32, 125 tensor; PCIe: 14 FP32, 112
  //         tensor; 900 GB/s both) and the Volta whitepaper, Table 1 (SXM2: 31.4 FP16
  //         non-tensor, twice FP32; the PCIe card's 28 is twice its 14). No bf16 in hardware: bf16
  //         GEMMs and arithmetic run on the FP32 units; no TF32.
  //   A100: NVIDIA A100 data sheet (19.5 FP32, 156 TF32, 312 BF16/FP16 tensor for SXM4 and PCIe
  //         alike; SXM4 1,555 GB/s for 40GB, 2,039 GB/s for 80GB; PCIe 1,555 and 1,935 GB/s) and
  //         the Ampere (A100) whitepaper, Table 1 (78 FP16 and 39 BF16 non-tensor).
  //   H100: NVIDIA H100 data sheet (SXM: 67 FP32, 989 BF16/FP16 tensor, 494.5 TF32 = half the
  //         sheet's sparse 989, 3.35 TB/s; PCIe: 51 FP32, 756 BF16/FP16, 378 TF32, 2 TB/s) and
  //         the Hopper whitepaper, Table 3 (133.8 FP16 and BF16 non-tensor on SXM, twice FP32;
  //         the PCIe card's 102 is twice its 51).
  //   H200: NVIDIA H200 data sheet, SXM (the same GH100 compute as the H100 SXM: 67 FP32, 989
  //         BF16/FP16, 494.5 TF32 dense; 4.8 TB/s); non-tensor FP16/BF16 as the H100 SXM's.
  // L2 cache (l2_bytes), SXM and PCIe alike: the Volta whitepaper, Table 1 (V100: 6,144 KB); the
  // Ampere (A100) whitepaper, Table 1 (A100: 40 MB); the Hopper whitepaper, Table 3 (H100 SXM5 and
  // PCIe: 50 MB); the H200, the same GH100 die as the H100 SXM (50 MB). Counted as MiB.
  // SMs (sms), the same documents: V100 80, A100 108, H100 SXM5 132, H100 PCIe 114, H200 132.
  auto v100 = [](const char* name, bool pcie, double memory) {
    const double fp32 = pcie ? 14.0 : 15.7;
    return HardwareSpec{.name = name,
                        .family = "V100",
                        .pcie = pcie,
                        .memory_bytes = memory,
                        .bf16 = fp32,
                        .fp16 = pcie ? 112.0 : 125.0,
                        .fp32 = fp32,
                        .memory_bandwidth = 900e9,
                        .l2_bytes = 6.0 * 1024 * 1024,
                        .sms = 80,
                        .bf16_vector = fp32,
                        .fp16_vector = 2 * fp32,
                        .tf32 = 0,
                        .tensor_bf16 = false,
                        .tensor_fp16 = true,
                        .source = pcie ? "datasheet: NVIDIA V100 PCIe; Volta whitepaper"
                                       : "datasheet: NVIDIA V100 SXM2; Volta whitepaper"};
  };
  auto a100 = [](const char* name, bool pcie, double memory, double bandwidth) {
    return HardwareSpec{.name = name,
                        .family = "A100",
                        .pcie = pcie,
                        .memory_bytes = memory,
                        .bf16 = 312.0,
                        .fp16 = 312.0,
                        .fp32 = 19.5,
                        .memory_bandwidth = bandwidth,
                        .l2_bytes = 40.0 * 1024 * 1024,
                        .sms = 108,
                        .bf16_vector = 39.0,
                        .fp16_vector = 78.0,
                        .tf32 = 156.0,
                        .source = pcie ? "datasheet: NVIDIA A100 PCIe; Ampere whitepaper"
                                       : "datasheet: NVIDIA A100 SXM4; Ampere whitepaper"};
  };
  auto hopper = [](const char* name, const char* family, bool pcie, double memory, double bandwidth,
                   const char* source) {
    const double fp32 = pcie ? 51.0 : 67.0;
    const double tensor = pcie ? 756.0 : 989.0;
    return HardwareSpec{.name = name,
                        .family = family,
                        .pcie = pcie,
                        .memory_bytes = memory,
                        .bf16 = tensor,
                        .fp16 = tensor,
                        .fp32 = fp32,
                        .memory_bandwidth = bandwidth,
                        .l2_bytes = 50.0 * 1024 * 1024,
                        .sms = pcie ? 114.0 : 132.0,
                        .bf16_vector = pcie ? 102.0 : 133.8,
                        .fp16_vector = pcie ? 102.0 : 133.8,
                        .tf32 = tensor / 2,
                        .source = source};
  };
  static const std::vector<HardwareSpec> specs = {
      v100("V100-16GB", false, 16e9),
      v100("V100-32GB", false, 32e9),
      v100("V100-PCIe-16GB", true, 16e9),
      v100("V100-PCIe-32GB", true, 32e9),
      a100("A100-40GB", false, 40e9, 1555e9),
      a100("A100-80GB", false, 80e9, 2039e9),
      a100("A100-PCIe-40GB", true, 40e9, 1555e9),
      a100("A100-PCIe-80GB", true, 80e9, 1935e9),
      hopper("H100-80GB", "H100", false, 80e9, 3350e9, "datasheet: NVIDIA H100 SXM; Hopper whitepaper"),
      hopper("H100-PCIe-80GB", "H100", true, 80e9, 2000e9, "datasheet: NVIDIA H100 PCIe; Hopper whitepaper"),
      hopper("H200-141GB", "H200", false, 141e9, 4800e9, "datasheet: NVIDIA H200 SXM; Hopper whitepaper"),
  };
  return specs;
}

namespace {

std::string lower_case(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::optional<HardwareSpec> hardware_spec(const std::string& name) {
  for (const HardwareSpec& d : hardware_specs()) {
    if (lower_case(d.name) == lower_case(name)) return d;
  }
  return std::nullopt;
}

std::optional<HardwareSpec> hardware_for_device_name(const std::string& device_name, double memory_bytes) {
  // The size in the name wins ("Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3"): a device's total
  // memory is a little under its nominal size (ECC, reserved pages).
  static const std::regex size_in_name(R"((\d+)\s*GB)", std::regex::icase);
  std::smatch m;
  if (std::regex_search(device_name, m, size_in_name)) memory_bytes = std::stod(m[1].str()) * 1e9;
  // A PCIe card says so in its name ("Tesla V100-PCIE-32GB", "NVIDIA H100 PCIe"); the SXM
  // parts do not always ("NVIDIA H200"). A form factor the table lacks takes the family's other.
  const bool pcie = lower_case(device_name).find("pcie") != std::string::npos;
  const auto& specs = hardware_specs();
  const bool has_form = std::any_of(specs.begin(), specs.end(), [&](const HardwareSpec& d) {
    return device_name.find(d.family) != std::string::npos && d.pcie == pcie;
  });
  std::optional<HardwareSpec> best;
  for (const HardwareSpec& d : specs) {
    if (device_name.find(d.family) == std::string::npos || (has_form && d.pcie != pcie)) continue;
    if (!best ||
        (memory_bytes > 0 && std::abs(d.memory_bytes - memory_bytes) < std::abs(best->memory_bytes - memory_bytes))) {
      best = d;
    }
  }
  return best;
}

std::optional<DevicePeak> gpu_peak(const std::string& device_name, at::ScalarType dtype) {
  const auto spec = hardware_for_device_name(device_name);
  if (!spec) return std::nullopt;
  return DevicePeak{device_name, spec->peak_tflops(dtype), "datasheet"};
}

std::optional<DevicePeak> device_peak(const at::Device& device, at::ScalarType dtype) {
  if (device.is_cpu()) {
    if (const auto peak = this_cpu_peak()) {
      return DevicePeak{device::name(device), peak->flops(std::string(dtype_name(dtype))) / 1e12, "theoretical"};
    }
    return DevicePeak{device::name(device), device::measure_cpu_gemm_tflops(), "measured"};
  }
  if (device.is_cuda()) return gpu_peak(device::name(device), dtype);
  return std::nullopt;
}

std::optional<std::string> peak_violation(double fraction, const std::string& what, const std::string& peak) {
  if (!(fraction > 1.0)) return std::nullopt;
  return fmt::format(
      "BUG: {} {:.1f}% exceeds 100% of {}: the peak does not hold or the measurement is wrong (please report it)", what,
      fraction * 100, peak);
}

}  // namespace kiln::cost
