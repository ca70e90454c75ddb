// Hardware counters: CounterSession's factory, and the session that counts nothing and says why
// (counters.h). Compiled in every build. The sessions that count are compiled only where they can
// be (lib/CMakeLists.txt, which defines the two macros on this source alone): perf_event.cpp with
// KILN_PROFILE_COUNTERS, cupti*.cpp where CMake also found CUPTI (KILN_WITH_CUPTI).
#include "kiln/profile/counters/counters.h"

#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "kiln/profile/counters/cupti.h"
#include "kiln/profile/counters/perf_event.h"

namespace kiln::profile {

CounterSession::~CounterSession() = default;

void CounterSession::phase(const std::string&) {}

namespace {

// A session that counts nothing, with the reason.
class UnavailableSession final : public CounterSession {
 public:
  explicit UnavailableSession(std::string reason) : reason_(std::move(reason)) {}
  bool available() const override { return false; }
  std::string reason() const override { return reason_; }
  void start() override { start_ = std::chrono::steady_clock::now(); }
  CounterReading stop() override {
    CounterReading r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    r.reason = r.memory_reason = r.tensor_reason = r.fp_reason = reason_;
    return r;
  }

 private:
  std::string reason_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

std::unique_ptr<CounterSession> CounterSession::open(const c10::Device& device, double peak_bandwidth_bytes_per_s,
                                                     const CounterOptions& options) {
#ifndef KILN_PROFILE_COUNTERS
  (void)device;
  (void)peak_bandwidth_bytes_per_s;
  (void)options;
  return std::make_unique<UnavailableSession>("n/a: kiln was built without KILN_PROFILE_COUNTERS");
#else
  try {
    if (device.is_cpu()) {
      return open_perf_event_session(peak_bandwidth_bytes_per_s, "/sys/bus/event_source/devices", options);
    }
    if (device.is_cuda()) {
#ifdef KILN_WITH_CUPTI
      return open_cupti_session(device, peak_bandwidth_bytes_per_s, options);
#else
      return std::make_unique<UnavailableSession>(
          "n/a: this build has no CUPTI (built without CUDA kernels, or CUPTI's range profiler headers were not found "
          "at configure time)");
#endif
    }
    return std::make_unique<UnavailableSession>("n/a: no hardware counters are read on a " +
                                                c10::DeviceTypeName(device.type(), true) + " device");
  } catch (const std::exception& e) {
    return std::make_unique<UnavailableSession>(std::string("n/a: opening the counters failed: ") + e.what());
  }
#endif
}

}  // namespace kiln::profile
