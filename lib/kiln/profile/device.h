// Peak arithmetic rates for MFU: a table of the GPUs kiln targets (dense, no sparsity, from the
// vendors' data sheets) and, on the CPU, a measured fp32 matmul rate.
#pragma once

#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

namespace kiln::profile {

struct DevicePeak {
  std::string name;    // "NVIDIA H200", "CPU (measured)"
  double tflops = 0;   // peak for the dtype asked for
  std::string source;  // "datasheet" or "measured"
};

// Peak dense TFLOP/s of a GPU by its reported name for `dtype` (bf16/fp16 on tensor cores, fp32
// on the FP32 units); nullopt for an unknown GPU (pass --peak-tflops).
std::optional<DevicePeak> gpu_peak(const std::string& device_name, at::ScalarType dtype);

// Measures the CPU's fp32 matmul rate with the threads LibTorch uses (about a second).
DevicePeak measure_cpu_peak();

// The peak for `device`: the table for a CUDA device, a measurement on the CPU.
std::optional<DevicePeak> device_peak(const at::Device& device, at::ScalarType dtype);

// Peak memory so far: the CUDA caching allocator's peak allocated bytes on a GPU, the process's
// peak resident set size on the CPU.
double peak_memory_bytes(const at::Device& device);
// Restarts the GPU peak counter (the CPU's peak RSS cannot be reset).
void reset_peak_memory(const at::Device& device);
int64_t peak_rss_bytes();
// The process's resident set now and its high-water mark (VmRSS, VmHWM of /proc/self/status), and
// a reset of the mark to the current size (writing "5" to /proc/self/clear_refs, Linux 4.0+): the
// "peak RSS over a baseline" that scripts/bench_vs_hf.py reads from kiln-profile and from
// transformers' process alike. nullopt / false where /proc does not offer them.
struct RssSample {
  int64_t current_bytes = 0, peak_bytes = 0;
};
std::optional<RssSample> read_rss();
bool reset_rss_peak();
// What the device holds in all: a GPU's total memory, or the machine's physical RAM on the CPU.
double device_memory_bytes(const at::Device& device);

// Waits for the device's queued work (CUDA); a no-op on the CPU, whose ops are synchronous.
void synchronize(const at::Device& device);
// The CUDA caching allocator's peak reserved bytes (what nvidia-smi roughly shows); nullopt on
// the CPU.
std::optional<double> peak_reserved_bytes(const at::Device& device);
// Returns cached blocks to the driver after an out-of-memory point (CUDA); no-op on the CPU.
void release_cached_memory(const at::Device& device);
// Caps the CUDA caching allocator at `bytes` of the device (a fraction of its memory); 0 lifts it.
void set_device_memory_cap(const at::Device& device, int64_t bytes);

}  // namespace kiln::profile
