#include "kiln/cost/hardware.h"

#include <algorithm>
#include <cctype>

#include "kiln/common/device.h"

namespace kiln::cost {

double HardwareSpec::peak_tflops(const std::string& dtype) const {
  return dtype == "bf16" ? bf16 : dtype == "fp16" ? fp16 : fp32;
}

double HardwareSpec::peak_tflops(at::ScalarType dtype) const {
  return dtype == at::kBFloat16 ? bf16 : dtype == at::kHalf ? fp16 : fp32;
}

const std::vector<HardwareSpec>& hardware_specs() {
  // name, family, memory, bf16, fp16, fp32 TFLOP/s, bandwidth.
  static const std::vector<HardwareSpec> specs = {
      {"V100-16GB", "V100", 16e9, 15.7, 125.0, 15.7, 900e9},
      {"V100-32GB", "V100", 32e9, 15.7, 125.0, 15.7, 900e9},
      {"A100-40GB", "A100", 40e9, 312.0, 312.0, 19.5, 1555e9},
      {"A100-80GB", "A100", 80e9, 312.0, 312.0, 19.5, 2039e9},
      {"H100-80GB", "H100", 80e9, 989.0, 989.0, 67.0, 3350e9},
      {"H200-141GB", "H200", 141e9, 989.0, 989.0, 67.0, 4800e9},
  };
  return specs;
}

std::optional<HardwareSpec> hardware_spec(const std::string& name) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  for (const HardwareSpec& d : hardware_specs()) {
    if (lower(d.name) == lower(name)) return d;
  }
  return std::nullopt;
}

std::optional<HardwareSpec> hardware_for_device_name(const std::string& device_name) {
  for (const HardwareSpec& d : hardware_specs()) {
    if (device_name.find(d.family) != std::string::npos) return d;
  }
  return std::nullopt;
}

std::optional<DevicePeak> gpu_peak(const std::string& device_name, at::ScalarType dtype) {
  const auto spec = hardware_for_device_name(device_name);
  if (!spec) return std::nullopt;
  return DevicePeak{device_name, spec->peak_tflops(dtype), "datasheet"};
}

std::optional<DevicePeak> device_peak(const at::Device& device, at::ScalarType dtype) {
  if (device.is_cpu()) {
    const double tflops = device::measure_cpu_gemm_tflops();
    return DevicePeak{device::name(device), tflops, "measured"};
  }
  if (device.is_cuda()) return gpu_peak(device::name(device), dtype);
  return std::nullopt;
}

}  // namespace kiln::cost
