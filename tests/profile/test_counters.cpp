// Hardware counters (lib/kiln/profile/counters/counters.h): the perf_event session where the kernel allows
// it (checked against each thread's own CPU clock), its reasons where it does not (against the
// perf_event_paranoid read here), the sysfs event encoding on a planted tree, CUPTI's metric plan
// per chip (host side, no GPU), and on a GPU the CUPTI session over a copy and a matmul.
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/common/device.h"
#include "kiln/cost/hardware.h"
#include "kiln/profile/counters/counters.h"
#include "kiln/profile/counters/perf_event.h"
#include "kiln/profile/sweep.h"
#include "support.h"
#ifdef KILN_WITH_CUPTI
#include "kiln/profile/counters/cupti.h"
#endif

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using kiln::profile::CounterReading;
using kiln::profile::CounterSession;

namespace {

std::optional<int> paranoid_here() {
  std::ifstream in("/proc/sys/kernel/perf_event_paranoid");
  int value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// `iterations` dependent multiply-adds (at least one instruction each); returns the result so
// that nothing is optimised away.
double busy(int64_t iterations) {
  double x = 1.0;
  for (int64_t i = 0; i < iterations; ++i) {
    x = x * 1.0000000001 + 1e-12;
    asm volatile("" : "+x"(x));
  }
  return x;
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// A PMU folder as the kernel lays it out under /sys/bus/event_source/devices.
void plant_pmu(const std::filesystem::path& dir, const std::string& type, const std::string& cpumask,
               const std::vector<std::pair<std::string, std::string>>& formats,
               const std::vector<std::pair<std::string, std::string>>& events) {
  write(dir / "type", type);
  if (!cpumask.empty()) write(dir / "cpumask", cpumask);
  for (const auto& [name, text] : formats) write(dir / "format" / name, text);
  for (const auto& [name, text] : events) write(dir / "events" / name, text);
}

// The device's DRAM bandwidth from the hardware table (0 for a GPU it does not know).
double data_sheet_bandwidth(const c10::Device& device) {
  const auto spec =
      kiln::cost::hardware_for_device_name(kiln::device::name(device), kiln::device::device_memory_bytes(device));
  return spec ? spec->memory_bandwidth : 0;
}

}  // namespace

TEST_CASE("perf_event counters: every thread's CPU time, cycles and instructions, or why not", "[profile][counters]") {
  const std::optional<int> paranoid = paranoid_here();
  const double peak = 100e9;
  auto session = CounterSession::open(c10::Device(c10::kCPU), peak);
  REQUIRE(session);
  if (!session->available()) {
    WARN("perf_event unavailable here: " << session->reason());
    CHECK_THAT(session->reason(), StartsWith("n/a: "));
    if (paranoid) {
      CHECK_THAT(session->reason(), Contains("perf_event_paranoid=" + std::to_string(*paranoid)));
    } else {
      CHECK_THAT(session->reason(), Contains("perf_event_paranoid"));
    }
    const CounterReading r = session->stop();
    CHECK(r.source.empty());
    CHECK_FALSE(r.cycles);
    CHECK(r.reason == session->reason());
    return;
  }

  // A thread alive before start() (counted through its own counter), one started inside the
  // interval (counted through inherit), and this one; each measures its own CPU clock.
  constexpr int64_t kIterations = 40'000'000;
  std::mutex mutex;
  std::condition_variable cv;
  bool go = false;
  double existing_cpu = 0, spawned_cpu = 0;
  std::thread existing([&] {
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return go; });
    }
    const double t0 = thread_cpu_seconds();
    busy(kIterations);
    existing_cpu = thread_cpu_seconds() - t0;
  });
  const auto wall0 = std::chrono::steady_clock::now();
  session->start();
  const double main0 = thread_cpu_seconds();
  {
    std::lock_guard<std::mutex> lock(mutex);
    go = true;
  }
  cv.notify_all();
  std::thread spawned([&] {
    busy(kIterations);
    spawned_cpu = thread_cpu_seconds();  // the thread's whole life is inside the interval
  });
  busy(kIterations);
  existing.join();
  spawned.join();
  const double main_cpu = thread_cpu_seconds() - main0;
  const CounterReading r = session->stop();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();

  INFO(r.detail);
  INFO(r.reason);
  CHECK(r.source == "perf_event");
  CHECK(r.seconds > 0);
  CHECK(r.seconds <= wall);
  CHECK(r.seconds >= main_cpu * 0.99);  // the interval holds at least this thread's work
  REQUIRE(r.cpu_seconds);
  const double expected = main_cpu + existing_cpu + spawned_cpu;
  WARN("perf_event task-clock " << *r.cpu_seconds << " s over " << r.seconds
                                << " s wall; the three threads' own clocks " << expected << " s");
  // Never less than what the threads themselves ran (a missed thread would lose a third); a little
  // more for the rest of the process (thread start-up, the library's own threads).
  CHECK(*r.cpu_seconds >= 0.97 * expected);
  CHECK(*r.cpu_seconds <= 1.10 * expected + 0.03);

  if (r.instructions) {
    // Three threads of kIterations dependent multiply-adds: at least one instruction each, and
    // no more than a few dozen with everything else the process did meanwhile.
    CHECK(*r.instructions >= 3.0 * kIterations);
    CHECK(*r.instructions <= 50.0 * 3 * kIterations);
    REQUIRE(r.cycles);
    CHECK(*r.cycles > 0);
  } else {
    WARN("cycles/instructions not counted here: " << r.reason);
    CHECK_FALSE(r.cycles);
    REQUIRE(paranoid);
    CHECK_THAT(r.reason, Contains("perf_event_paranoid=" + std::to_string(*paranoid)));
  }

  if (r.dram_bytes) {
    REQUIRE(r.memory_bandwidth);
    CHECK(*r.memory_bandwidth == Approx(*r.dram_bytes / r.seconds / peak));
    CHECK(r.memory_reason.empty());
  } else {
    CHECK_FALSE(r.memory_bandwidth);
    CHECK_THAT(r.memory_reason, StartsWith("n/a: "));
    CHECK_THAT(r.reason, Contains(r.memory_reason));
  }
  // A CPU has neither column here; each says why.
  CHECK_FALSE(r.tensor_core);
  CHECK_FALSE(r.fp_engine);
  CHECK_THAT(r.tensor_reason, StartsWith("n/a: "));
  CHECK_THAT(r.fp_reason, StartsWith("n/a: "));
  CHECK(r.reason.find('\n') == std::string::npos);

  // A second interval on the same session counts afresh.
  session->start();
  busy(kIterations / 4);
  const CounterReading again = session->stop();
  REQUIRE(again.cpu_seconds);
  CHECK(*again.cpu_seconds < *r.cpu_seconds);
}

TEST_CASE("perf_event counters per phase: each phase's segments, against this thread's own clock",
          "[profile][counters]") {
  kiln::profile::CounterOptions options;
  options.phases = true;
  auto session = CounterSession::open(c10::Device(c10::kCPU), 100e9, options);
  REQUIRE(session);
  session->phase("before start");  // outside an interval: nothing
  if (!session->available()) {
    WARN("perf_event unavailable here: " << session->reason());
    session->start();
    session->phase("a");
    CHECK(session->stop().phases.empty());
    return;
  }
  // Phase a twice (N each), phase b once (3N) between them; this thread's CPU clock per segment is
  // the reference. The first phase() also takes the work since start().
  constexpr int64_t kIterations = 20'000'000;
  double a_cpu = 0, b_cpu = 0;
  session->start();
  double t0 = thread_cpu_seconds();
  busy(kIterations / 4);
  session->phase("a");
  busy(kIterations);
  double t1 = thread_cpu_seconds();
  a_cpu += t1 - t0;
  session->phase("b");
  busy(3 * kIterations);
  double t2 = thread_cpu_seconds();
  b_cpu += t2 - t1;
  session->phase("a");
  busy(kIterations);
  const CounterReading r = session->stop();
  a_cpu += thread_cpu_seconds() - t2;
  INFO(r.detail);
  INFO(r.reason);
  REQUIRE(r.phases.size() == 2);
  CHECK(r.phases[0].name == "a");
  CHECK(r.phases[0].segments == 2);
  CHECK(r.phases[1].name == "b");
  CHECK(r.phases[1].segments == 1);
  CHECK(r.phases[0].seconds + r.phases[1].seconds == Approx(r.seconds).epsilon(0.01));
  for (const auto& p : r.phases) CHECK_FALSE(p.gpu_seconds);
  if (r.cpu_seconds) {
    REQUIRE(r.phases[0].cpu_seconds);
    REQUIRE(r.phases[1].cpu_seconds);
    // The phases partition the interval: their counts add up to its own.
    CHECK(*r.phases[0].cpu_seconds + *r.phases[1].cpu_seconds == Approx(*r.cpu_seconds).epsilon(1e-9));
    WARN("task-clock per phase: a " << *r.phases[0].cpu_seconds << " s (own clock " << a_cpu << " s), b "
                                    << *r.phases[1].cpu_seconds << " s (own clock " << b_cpu << " s)");
    CHECK(*r.phases[0].cpu_seconds >= 0.97 * a_cpu);
    CHECK(*r.phases[0].cpu_seconds <= 1.10 * a_cpu + 0.03);
    CHECK(*r.phases[1].cpu_seconds >= 0.97 * b_cpu);
    CHECK(*r.phases[1].cpu_seconds <= 1.10 * b_cpu + 0.03);
  } else {
    CHECK_FALSE(r.phases[0].cpu_seconds);
  }
  if (r.instructions) {
    REQUIRE(r.phases[1].instructions);
    CHECK(*r.phases[1].instructions >= 3.0 * kIterations);
    CHECK(*r.phases[0].instructions + *r.phases[1].instructions == Approx(*r.instructions).epsilon(1e-9));
  }
  CHECK(r.phases[0].dram_bytes.has_value() == r.dram_bytes.has_value());

  // A new interval starts its phases afresh; one without phase() calls has none.
  session->start();
  session->phase("c");
  busy(kIterations / 10);
  const CounterReading again = session->stop();
  REQUIRE(again.phases.size() == 1);
  CHECK(again.phases[0].name == "c");
  session->start();
  busy(kIterations / 10);
  CHECK(session->stop().phases.empty());

  // Without CounterOptions::phases, phase() does nothing.
  auto plain = CounterSession::open(c10::Device(c10::kCPU), 100e9);
  plain->start();
  plain->phase("a");
  busy(kIterations / 10);
  CHECK(plain->stop().phases.empty());
}

TEST_CASE("perf_event sysfs events: encoded from format/, scaled to bytes, free-running first", "[profile][counters]") {
  namespace perf = kiln::profile::perf;
  const auto root = kiln::test::scratch_dir("counters_sysfs");
  const std::vector<std::pair<std::string, std::string>> imc_format = {{"event", "config:0-7"},
                                                                       {"umask", "config:8-15"}};
  for (const std::string imc : {"uncore_imc_0", "uncore_imc_1"}) {
    plant_pmu(root / "intel" / imc, "14", "0,28", imc_format,
              {{"cas_count_read", "event=0x04,umask=0x03"},
               {"cas_count_read.scale", "6.103515625e-5"},
               {"cas_count_read.unit", "MiB"},
               {"cas_count_write", "event=0x04,umask=0x0c"},
               {"cas_count_write.scale", "6.103515625e-5"},
               {"cas_count_write.unit", "MiB"}});
  }
  plant_pmu(root / "intel" / "cpu", "4", "", {{"event", "config:0-7"}}, {{"instructions", "event=0xc0"}});

  std::string why;
  std::vector<perf::SysfsEvent> events = perf::find_dram_events((root / "intel").string(), &why);
  REQUIRE(events.size() == 4);
  CHECK(events[0].pmu == "uncore_imc_0");
  CHECK(events[0].name == "cas_count_read");
  CHECK(events[0].type == 14);
  CHECK(events[0].config == 0x0304);
  CHECK(events[1].config == 0x0c04);
  CHECK(events[0].bytes_per_count == 64.0);  // one 64-byte line per CAS command
  CHECK(events[0].cpus == std::vector<int>{0, 28});
  CHECK(events[3].pmu == "uncore_imc_1");

  // Free-running counters win where both exist; split bit ranges and config1 encode too.
  plant_pmu(root / "intel" / "uncore_imc_free_running_0", "20", "0",
            {{"event", "config:0-3,8-11"}, {"umask", "config1:0-7"}},
            {{"data_read", "event=0xab,umask=0x20"},
             {"data_read.scale", "1"},
             {"data_read.unit", "KiB"},
             {"data_write", "event=0x1,umask=0x30"},
             {"data_write.scale", "0.5"},
             {"data_write.unit", "Bytes"}});
  events = perf::find_dram_events((root / "intel").string(), &why);
  REQUIRE(events.size() == 2);
  CHECK(events[0].name == "data_read");
  CHECK(events[0].config == 0xa0b);
  CHECK(events[0].config1 == 0x20);
  CHECK(events[0].bytes_per_count == 1024.0);
  CHECK(events[1].bytes_per_count == 0.5);

  // Malformed events are refused with the file named, never guessed.
  plant_pmu(
      root / "bad" / "uncore_imc_0", "14", "0", imc_format,
      {{"cas_count_read", "event=0x1ff"}, {"cas_count_write", "event=0x04"}, {"cas_count_write.unit", "furlong"}});
  std::string error;
  CHECK_FALSE(perf::read_sysfs_event((root / "bad" / "uncore_imc_0").string(), "cas_count_read", &error));
  CHECK_THAT(error, Contains("does not fit format/event"));
  CHECK_FALSE(perf::read_sysfs_event((root / "bad" / "uncore_imc_0").string(), "cas_count_write", &error));
  CHECK_THAT(error, Contains("furlong"));
  CHECK(perf::find_dram_events((root / "bad").string(), &why).empty());
  CHECK_THAT(why, Contains("does not fit"));

  // AMD's data fabric PMU names no DRAM event in sysfs; a folder without uncore PMUs lists what it has.
  plant_pmu(root / "amd" / "amd_df", "11", "0", {{"event", "config:0-7"}}, {});
  CHECK(perf::find_dram_events((root / "amd").string(), &why).empty());
  CHECK_THAT(why, Contains("amd_df"));
  plant_pmu(root / "none" / "software", "1", "", {}, {});
  CHECK(perf::find_dram_events((root / "none").string(), &why).empty());
  CHECK_THAT(why, Contains("no uncore_imc PMU") && Contains("software"));
}

TEST_CASE("counter sessions never throw: a device without counters says why", "[profile][counters]") {
  auto meta = CounterSession::open(c10::Device(c10::kMeta), 1e12);
  CHECK_FALSE(meta->available());
  CHECK_THAT(meta->reason(), StartsWith("n/a: ") && Contains("meta"));
  meta->start();
  const CounterReading r = meta->stop();
  CHECK(r.source.empty());
  CHECK(r.reason == meta->reason());
  CHECK(r.memory_reason == meta->reason());
  CHECK(r.seconds >= 0);

  if (!torch::cuda::is_available()) {
    auto cuda = CounterSession::open(c10::Device(c10::kCUDA, 0), 4.8e12);
    CHECK_FALSE(cuda->available());
    CHECK_THAT(cuda->reason(), StartsWith("n/a: "));
    CHECK(cuda->reason().find('\n') == std::string::npos);
    cuda->start();
    CHECK_FALSE(cuda->stop().memory_bandwidth);
  }
}

#ifdef KILN_WITH_CUPTI
TEST_CASE("CUPTI metric plan: one pass per chip, each column's metric or why not", "[profile][counters]") {
  using kiln::profile::plan_cupti_metrics;
  // H100/H200: every column in one pass; the tensor pipe counts HMMA and WGMMA together.
  const auto hopper = plan_cupti_metrics("GH100", {});
  INFO(hopper.error);
  REQUIRE(hopper.error.empty());
  CHECK(hopper.passes == 1);
  for (const auto& c : hopper.columns) {
    INFO(c.column << ": " << c.reason);
    CHECK(c.reason.empty());
    CHECK_FALSE(c.metrics.empty());
  }
  CHECK(hopper.find("duration")->metrics == std::vector<std::string>{"gpu__time_duration.sum"});
  CHECK(hopper.find("tensor pipe")->metrics ==
        std::vector<std::string>{"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"});
  CHECK(hopper.find("dram bytes")->metrics ==
        std::vector<std::string>{"dram__bytes_read.sum", "dram__bytes_write.sum"});
  CHECK(plan_cupti_metrics("GA100", {}).metric_names() == hopper.metric_names());

  // V100: the five do not fit one pass; what does not fit says so and is left out.
  const auto volta = plan_cupti_metrics("GV100", {});
  REQUIRE(volta.error.empty());
  CHECK(volta.passes == 1);
  CHECK(volta.find("duration")->reason.empty());
  bool second_pass = false;
  for (const auto& c : volta.columns) second_pass |= c.reason.find("needs a second pass") != std::string::npos;
  CHECK(second_pass);

  // RTX 5090: no separate read/write DRAM counters, so their sum.
  CHECK(plan_cupti_metrics("GB202", {}).find("dram bytes")->metrics == std::vector<std::string>{"dram__bytes.sum"});

  const auto unknown = plan_cupti_metrics("NOSUCHCHIP", {});
  CHECK_THAT(unknown.error, StartsWith("n/a: CUPTI: "));
  CHECK(unknown.columns.empty());
}

// The ranges of a one-range-per-phase-segment interval, placed on their phases as CUPTI may return
// them (its API reference keeps metrics "per unique range-stack", so it may merge same-named
// segments; whether it does is for a GPU to show).
TEST_CASE("CUPTI per-phase ranges: placed by CUPTI's names, else by push order", "[profile][counters]") {
  using kiln::profile::cupti_range_phases;
  const std::vector<std::string> phases = {"forward", "backward", "optimizer"};
  // GA 2, one step: forward, backward, forward, backward, optimizer.
  const std::vector<int> pushed = {0, 1, 0, 1, 2};
  // Every segment its own range, named.
  CHECK(cupti_range_phases({"forward", "backward", "forward", "backward", "optimizer"}, pushed, 0, phases) ==
        std::vector<int>{0, 1, 0, 1, 2});
  // Same-named segments merged into one range each, in first-seen order or not.
  CHECK(cupti_range_phases({"forward", "backward", "optimizer"}, pushed, 0, phases) == std::vector<int>{0, 1, 2});
  CHECK(cupti_range_phases({"optimizer", "forward", "backward"}, pushed, 0, phases) == std::vector<int>{2, 0, 1});
  // A nesting prefix in the stored name.
  CHECK(cupti_range_phases({"kiln/forward", "kiln/backward"}, {0, 1}, 0, phases) == std::vector<int>{0, 1});
  // No names: push order, when every segment is accounted for (counted or dropped).
  CHECK(cupti_range_phases({"", "", "", "", ""}, pushed, 0, phases) == std::vector<int>{0, 1, 0, 1, 2});
  CHECK(cupti_range_phases({"", "", ""}, pushed, 2, phases) == std::vector<int>{0, 1, 0});
  // No names and segments missing (merged, or lost): nothing can be placed.
  CHECK(cupti_range_phases({"", "", ""}, pushed, 0, phases).empty());
  // A name that is no phase's, with the counts off: not placed either.
  CHECK(cupti_range_phases({"forward", "kiln interval"}, pushed, 0, phases).empty());
  // A name that is no phase's, counts matching: the push order places it.
  CHECK(cupti_range_phases({"forward", "range 1"}, {0, 1}, 0, phases) == std::vector<int>{0, 1});
  CHECK(cupti_range_phases({}, {}, 0, phases).empty());
}
#endif

// Both CUPTI collections on the same work: one range over the interval (the default, what
// kiln-profile sweep --counters uses) and one range per kernel (--counters-per-kernel).
TEST_CASE("CUPTI counters over a copy and a bf16 matmul", "[profile][counters][cuda]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA device: the CUPTI session is not exercised here");
    return;
  }
  const c10::Device device(c10::kCUDA, 0);
  const double peak = data_sheet_bandwidth(device);

  // 1 GiB read and 1 GiB written, 4 times: DRAM-bound, no tensor cores. An element-wise kernel,
  // not copy_: a contiguous device-to-device copy_ is a cudaMemcpy, no kernel, and CUPTI's range
  // profiler counts kernels only (the first H200 run of this test saw 0 launches).
  const at::Tensor src = at::rand({256, 1024, 1024}, at::TensorOptions().device(device));
  at::Tensor dst = at::empty_like(src);
  at::mul_out(dst, src, 2.0);
  const double moved = 4.0 * 2 * static_cast<double>(src.nbytes());
  const auto bf16 = at::TensorOptions().device(device).dtype(at::kBFloat16);
  const at::Tensor a = at::randn({8192, 8192}, bf16), b = at::randn({8192, 8192}, bf16);
  at::Tensor c = at::matmul(a, b);
  // Many small kernels: what a training step launches. Their wall time uncounted, then counted.
  at::Tensor small = at::ones({4096}, at::TensorOptions().device(device));
  auto small_kernels = [&] {
    torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 500; ++i) small.mul_(1.0);
    torch::cuda::synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  small_kernels();
  const double uncounted = small_kernels();
  torch::cuda::synchronize();

  for (const bool per_kernel : {false, true}) {
    INFO((per_kernel ? "one range per kernel" : "one range over the interval"));
    auto session = CounterSession::open(device, peak, kiln::profile::CounterOptions{.per_kernel = per_kernel});
    if (!session->available()) {
      // Counters restricted to administrators, or another profiler: the one-line reason, no crash.
      WARN("CUPTI unavailable: " << session->reason());
      CHECK_THAT(session->reason(), StartsWith("n/a: "));
      CHECK(session->reason().find('\n') == std::string::npos);
      return;
    }
    session->start();
    for (int i = 0; i < 4; ++i) at::mul_out(dst, src, 2.0);
    torch::cuda::synchronize();
    const CounterReading copy = session->stop();
    INFO(copy.detail);
    INFO(copy.reason);
    CHECK(copy.source == "cupti");
    CHECK(copy.ranges == (per_kernel ? 4 : 1));
    REQUIRE(copy.gpu_seconds);
    CHECK(*copy.gpu_seconds > 0);
    CHECK(*copy.gpu_seconds <= copy.seconds);
    REQUIRE(copy.dram_bytes);
    WARN((per_kernel ? "per kernel" : "interval")
         << " copy: " << *copy.dram_bytes / 1e9 << " GB counted for " << moved / 1e9 << " GB moved, memory throughput "
         << copy.memory_throughput.value_or(-1) << ", bandwidth " << copy.memory_bandwidth.value_or(-1) << " of "
         << peak / 1e12 << " TB/s, GPU " << *copy.gpu_seconds * 1e3 << " ms, stop() " << copy.collect_seconds * 1e3
         << " ms, " << copy.kernels.size() << " kernel names");
    CHECK(*copy.dram_bytes == Approx(moved).epsilon(0.05));
    REQUIRE(copy.memory_throughput);
    CHECK(*copy.memory_throughput > 0.5);
    if (peak > 0) {
      REQUIRE(copy.memory_bandwidth);
      CHECK(*copy.memory_bandwidth > 0.5);
      CHECK(*copy.memory_bandwidth < 1.05);
    }
    REQUIRE(copy.tensor_core);
    CHECK(*copy.tensor_core < 0.01);
    if (per_kernel) {
      REQUIRE_FALSE(copy.kernels.empty());
      if (copy.detail.find("named from the launch callbacks") != std::string::npos) {
        CHECK(copy.kernels.front().launches == 4);  // one copy kernel, four launches
      }
      CHECK(copy.per_range.front().first == copy.kernels.front().name);
    } else {
      CHECK(copy.kernels.empty());  // one range: no per-kernel rows
    }

    // The same kernels launched from another thread inside the interval, as autograd launches the
    // backward's from its device thread: counted as the main thread's (CUPTI's guide has the range
    // profiler per context; Kineto's comment on the older API says it must be enabled on the thread
    // that runs the kernels: this settles which holds).
    session->start();
    std::thread other([&] {
      for (int i = 0; i < 4; ++i) at::mul_out(dst, src, 2.0);
      torch::cuda::synchronize();
    });
    other.join();
    const CounterReading threaded = session->stop();
    INFO(threaded.reason);
    REQUIRE(threaded.dram_bytes);
    WARN((per_kernel ? "per kernel" : "interval")
         << " copy from a second thread: " << *threaded.dram_bytes / 1e9 << " GB counted for " << moved / 1e9
         << " GB moved, " << threaded.ranges << " ranges");
    CHECK(*threaded.dram_bytes == Approx(moved).epsilon(0.05));
    CHECK(threaded.ranges == (per_kernel ? 4 : 1));

    // A bf16 matmul: tensor cores busy, little DRAM traffic per FLOP.
    torch::cuda::synchronize();
    session->start();
    for (int i = 0; i < 3; ++i) c = at::matmul(a, b);
    torch::cuda::synchronize();
    const CounterReading mm = session->stop();
    INFO(mm.detail);
    INFO(mm.reason);
    REQUIRE(mm.tensor_core);
    WARN((per_kernel ? "per kernel" : "interval")
         << " matmul: tensor core " << *mm.tensor_core << ", fp engine " << mm.fp_engine.value_or(-1)
         << ", memory throughput " << mm.memory_throughput.value_or(-1)
         << ", kernels: " << (mm.kernels.empty() ? std::string("none") : mm.kernels.front().name));
    CHECK(*mm.tensor_core > 0.3);
    CHECK(*mm.tensor_core <= 1.05);
    REQUIRE(mm.memory_throughput);
    CHECK(*mm.memory_throughput < *copy.memory_throughput);

    // 500 small kernels under the counters: one range leaves them at their own pace (no
    // serialisation, nothing saved); per kernel, each waits for CUPTI. The ratio is the figure.
    session->start();
    const double counted = small_kernels();
    const CounterReading many = session->stop();
    INFO(many.detail);
    WARN((per_kernel ? "per kernel" : "interval")
         << ": 500 small kernels in " << counted * 1e3 << " ms counted, " << uncounted * 1e3 << " ms uncounted ("
         << counted / uncounted << "x), " << many.ranges << " ranges, stop() " << many.collect_seconds * 1e3 << " ms");
    CHECK(many.ranges == (per_kernel ? 500 : 1));
    if (!per_kernel) CHECK(counted < 3 * uncounted + 0.05);
  }
}

// Phases (CounterOptions::phases, kiln-profile sweep --counter-phases) in both CUPTI collections: each
// phase's DRAM bytes against what its kernels move, one phase entered twice, one phase's kernels
// launched from another thread (as autograd launches backward's).
TEST_CASE("CUPTI counters per phase", "[profile][counters][cuda]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA device: the CUPTI session is not exercised here");
    return;
  }
  const c10::Device device(c10::kCUDA, 0);
  const double peak = data_sheet_bandwidth(device);
  const at::Tensor src = at::rand({128, 1024, 1024}, at::TensorOptions().device(device));  // 512 MiB
  at::Tensor dst = at::empty_like(src);
  at::mul_out(dst, src, 2.0);
  const double pass = 2.0 * static_cast<double>(src.nbytes());  // one mul_out reads and writes it
  torch::cuda::synchronize();

  for (const bool per_kernel : {false, true}) {
    INFO((per_kernel ? "per kernel" : "one range per phase segment"));
    kiln::profile::CounterOptions options;
    options.per_kernel = per_kernel;
    options.phases = true;
    auto session = CounterSession::open(device, peak, options);
    if (!session->available()) {
      WARN("CUPTI unavailable: " << session->reason());
      CHECK_THAT(session->reason(), StartsWith("n/a: "));
      return;
    }
    session->start();
    session->phase("one");
    at::mul_out(dst, src, 2.0);
    session->phase("three");
    std::thread other([&] {
      for (int i = 0; i < 3; ++i) at::mul_out(dst, src, 2.0);
    });
    other.join();
    session->phase("one");
    at::mul_out(dst, src, 2.0);
    torch::cuda::synchronize();
    const CounterReading r = session->stop();
    INFO(r.detail);
    INFO(r.reason);
    REQUIRE(r.dram_bytes);
    REQUIRE(r.phases.size() == 2);
    const auto& one = r.phases[0];
    const auto& three = r.phases[1];
    CHECK(one.name == "one");
    CHECK(one.segments == 2);
    CHECK(three.name == "three");
    CHECK(three.segments == 1);
    REQUIRE(one.dram_bytes);
    REQUIRE(three.dram_bytes);
    WARN((per_kernel ? "per kernel" : "per segment")
         << ": phase one " << *one.dram_bytes / 1e9 << " GB (moves " << 2 * pass / 1e9 << "), phase three "
         << *three.dram_bytes / 1e9 << " GB (moves " << 3 * pass / 1e9 << "), " << r.ranges << " ranges, GPU "
         << one.gpu_seconds.value_or(-1) * 1e3 << " + " << three.gpu_seconds.value_or(-1) * 1e3 << " ms");
    CHECK(*one.dram_bytes == Approx(2 * pass).epsilon(0.05));
    CHECK(*three.dram_bytes == Approx(3 * pass).epsilon(0.05));
    CHECK(*one.dram_bytes + *three.dram_bytes == Approx(*r.dram_bytes).epsilon(1e-6));
    REQUIRE(one.gpu_seconds);
    REQUIRE(three.gpu_seconds);
    CHECK(*three.gpu_seconds > *one.gpu_seconds);
    if (per_kernel) {
      CHECK(one.kernels == 2);
      CHECK(three.kernels == 3);
    }
    if (peak > 0) {
      REQUIRE(three.memory_bandwidth);
      CHECK(*three.memory_bandwidth > 0.3);
      CHECK(*three.memory_bandwidth < 1.05);
    }
  }
}

// Per kernel, each kernel's component at its launch (profile/kernel_components.h): a tiny sweep on
// the GPU with --counters-per-kernel --counter-phases, its per-component counted bytes beside the
// model's. Tiny's tensors fit in L2, so the counted DRAM bytes may fall below the compulsory bytes
// the model counts: the structure is checked, the ratios are printed for the record.
TEST_CASE("CUPTI counters per component of a tiny sweep", "[profile][counters][per_component][cuda]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA device: the CUPTI session is not exercised here");
    return;
  }
  kiln::profile::ProfileSettings cfg;
  cfg.run.model = "tiny";
  cfg.dtype = "bf16";
  cfg.run.device = "cuda";
  cfg.cutoff_len = {256};
  cfg.per_device_train_batch_size = {4};
  cfg.gradient_accumulation_steps = {2};
  cfg.steps = 1;
  cfg.warmup = 1;
  cfg.counters = cfg.counters_per_kernel = cfg.counter_phases = true;
  cfg.counter_steps = 1;
  cfg.formats = {};
  const auto report = kiln::profile::run_sweep(cfg);
  REQUIRE(report.rows.size() == 1);
  const auto& row = report.rows[0];
  REQUIRE(row.status == "ok");
  REQUIRE(row.counters);
  const CounterReading& c = *row.counters;
  INFO(c.detail);
  INFO(c.reason);
  if (c.source != "cupti") {
    WARN("CUPTI unavailable: " << c.reason);
    return;
  }
  REQUIRE_FALSE(c.components.empty());
  int64_t placed = 0;
  for (const auto& k : c.components) placed += k.launches;
  const int64_t unplaced = c.unattributed ? c.unattributed->launches : 0;
  WARN("per component: " << placed << " launches placed, " << unplaced << " not, of " << c.ranges);
  CHECK(placed + unplaced == c.ranges);
  CHECK(unplaced <= c.ranges / 10);
  for (const auto& comp : row.components) {
    if (comp.counted_bytes)
      WARN(comp.component << " (" << comp.pass << "): " << *comp.counted_bytes / 1e6 << " MB counted, "
                          << comp.bytes / 1e6 << " MB modelled");
  }
  auto counted = [&](const std::string& component, const std::string& pass) {
    for (const auto& comp : row.components) {
      if (comp.component == component && comp.pass == pass) return comp.counted_bytes.has_value();
    }
    return false;
  };
  for (const char* proj : {"q_proj", "o_proj", "down_proj", "LM head + loss"}) {
    CHECK(counted(proj, "fwd"));
    CHECK(counted(proj, "bwd"));
  }
  CHECK(counted("AdamW", "step"));
  // The phases of the same interval: per kernel, the phase current at its launch.
  REQUIRE(c.phases.size() == 3);
  CHECK(c.phases[1].name == "backward");
  CHECK(c.phases[1].kernels > 0);
}
