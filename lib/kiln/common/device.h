// What the trainer and the profiler ask of the device they run on: its name, its memory and the
// peaks of its use (the CUDA caching allocator's counters, the process's RSS), synchronisation,
// and the CPU's measured GEMM rate. The GPUs' data-sheet peaks are cost/hardware.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

namespace kiln::device {

// The device a setting `auto | cpu | cuda` names: kiln-pretrain's and kiln-profile's `device`
// key, the other programs' --device. auto is the first GPU when CUDA has one and the CPU otherwise;
// cuda needs a GPU. Throws std::invalid_argument for another word
// ("'gpu' is not auto, cpu or cuda") and for cuda without a GPU ("'cuda' but no CUDA device is
// present"); the caller puts its key or flag in front. The one resolver of the repository.
at::Device resolve(const std::string& spec);
// resolve()'s word check alone, which needs no GPU: for a setting checked before it runs (or for
// a device that is described, not used: kiln-profile plan and explain).
void check_spec(const std::string& spec);

// "CPU (2 threads)" (the threads LibTorch's ops use), or the name CUDA reports ("NVIDIA H200").
std::string name(const at::Device& device);

// Measures the CPU's fp32 GEMM rate in TFLOP/s with the threads LibTorch uses (about half a
// second): the rate behind MFU on the CPU.
double measure_cpu_gemm_tflops();

// Measures the CPU's memory bandwidth in bytes/s, STREAM's "copy" kernel through ATen: one fp32
// tensor of 64 MiB (past the last-level caches of the CPUs kiln runs on) copied into another
// with the threads LibTorch uses, best of 5 after one warm-up, counting the bytes read and written
// (2 x 64 MiB per copy, as STREAM counts; the write-allocate reads a CPU also makes are not).
// About a tenth of a second: the roofline's bandwidth on the CPU (cost/cpu_peak.h).
double measure_cpu_copy_bandwidth();

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
// Throws, naming the device, when CUDA cannot tell (never 0 for a GPU). name() too, for a GPU.
double device_memory_bytes(const at::Device& device);

// Waits for the device's queued work (CUDA); a no-op on the CPU, whose ops are synchronous.
// Throws std::runtime_error naming the CUDA call and the device when CUDA reports an error (no
// driver, no such device, an error a kernel left); the previous current device is restored either way.
void synchronize(const at::Device& device);
// The CUDA caching allocator's peak reserved bytes (what nvidia-smi roughly shows); nullopt on
// the CPU.
std::optional<double> peak_reserved_bytes(const at::Device& device);
// Returns cached blocks to the driver after an out-of-memory point (CUDA); no-op on the CPU.
void release_cached_memory(const at::Device& device);
// Caps the CUDA caching allocator at `bytes` of the device (a fraction of its memory); 0 lifts it.
void set_device_memory_cap(const at::Device& device, int64_t bytes);

// While it lives, a CUDA call that makes the host wait for the device throws (PyTorch's
// synchronisation debug mode "error", torch.cuda.set_sync_debug_mode): a test that a region, such
// as a training step, never synchronises. Process-wide, as PyTorch's mode is; the previous mode
// comes back at the end. Does nothing in a build without CUDA.
class SyncCheckScope {
 public:
  SyncCheckScope();
  ~SyncCheckScope();
  SyncCheckScope(const SyncCheckScope&) = delete;
  SyncCheckScope& operator=(const SyncCheckScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace kiln::device
