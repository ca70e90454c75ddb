// The CPU's counter session: perf_event_open(2) over the process's threads, and the DRAM events a
// PMU names in sysfs (counters.h says what is counted and what it needs). Compiled only with
// KILN_PROFILE_COUNTERS (lib/CMakeLists.txt); counters.cpp opens it from CounterSession::open.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/profile/counters/counters.h"

namespace kiln::profile {

// The perf_event session; `devices_dir` is where the PMUs are named (/sys/bus/event_source/devices).
// Never throws for a missing event or permission (the session says why); may throw otherwise.
std::unique_ptr<CounterSession> open_perf_event_session(double peak_bandwidth_bytes_per_s,
                                                        const std::string& devices_dir, const CounterOptions& options);

// The sysfs event reader, exposed for the tests.
namespace perf {

// /proc/sys/kernel/perf_event_paranoid, or nullopt when the file is missing (no perf events).
std::optional<int> read_paranoid();

// A PMU event named in sysfs (<pmu_dir>/type, format/*, events/<name>[.scale|.unit], cpumask),
// encoded for perf_event_attr.
struct SysfsEvent {
  std::string pmu;  // the PMU folder's name, e.g. "uncore_imc_0"
  std::string name;
  uint32_t type = 0;
  uint64_t config = 0, config1 = 0, config2 = 0;
  double bytes_per_count = 1;  // .scale x .unit ("MiB", "KiB", "Bytes", ...)
  std::vector<int> cpus;       // cpumask: where a system-wide (uncore) event is opened
};
// Reads and encodes one event; nullopt with *error set when a file is missing or malformed.
std::optional<SysfsEvent> read_sysfs_event(const std::string& pmu_dir, const std::string& event, std::string* error);

// The DRAM read and write events under `devices_dir` (/sys/bus/event_source/devices): Intel's
// uncore_imc_<n> cas_count_read/cas_count_write, or uncore_imc_free_running_<n> data_read/data_write.
// Empty when none; *why then names what the folder has instead.
std::vector<SysfsEvent> find_dram_events(const std::string& devices_dir, std::string* why);

}  // namespace perf

}  // namespace kiln::profile
