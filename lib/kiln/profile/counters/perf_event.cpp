// The CPU's counter session through perf_event_open(2), and the sysfs event reader (perf_event.h).
// Compiled with KILN_PROFILE_COUNTERS only; counters.cpp opens it.
#include "kiln/profile/counters/perf_event.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace kiln::profile {

namespace {

namespace fs = std::filesystem;

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return trim(ss.str());
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) out.push_back(trim(item));
  return out;
}

// "0-3,8" -> {0, 1, 2, 3, 8}; nullopt when malformed.
std::optional<std::vector<int>> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  for (const std::string& part : split(text, ',')) {
    if (part.empty()) continue;
    try {
      const auto dash = part.find('-');
      const int lo = std::stoi(part.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      if (lo < 0 || hi < lo) return std::nullopt;
      for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return cpus;
}

// CapEff of this process has the capability `bit` (CAP_SYS_ADMIN 21, CAP_PERFMON 38).
bool has_capability(int bit) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      try {
        return (std::stoull(trim(line.substr(7)), nullptr, 16) >> bit) & 1ULL;
      } catch (const std::exception&) {
        return false;
      }
    }
  }
  return false;
}

std::string errno_name(int err) {
  switch (err) {
    case EACCES:
      return "EACCES";
    case EPERM:
      return "EPERM";
    case ENOENT:
      return "ENOENT";
    case ENODEV:
      return "ENODEV";
    case EOPNOTSUPP:
      return "EOPNOTSUPP";
    case ENOSYS:
      return "ENOSYS";
    case EINVAL:
      return "EINVAL";
    case EBUSY:
      return "EBUSY";
    case EMFILE:
      return "EMFILE";
    case ESRCH:
      return "ESRCH";
    default:
      return fmt::format("errno {}", err);
  }
}

int perf_event_open(perf_event_attr* attr, pid_t pid, int cpu) {
  return static_cast<int>(syscall(SYS_perf_event_open, attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC));
}

// One event as opened: per thread (pid = tid, inherit) or system-wide on one CPU (uncore).
struct EventSpec {
  std::string name;
  uint32_t type = 0;
  uint64_t config = 0, config1 = 0, config2 = 0;
  bool system_wide = false;
  bool exclude_kernel = false;
  double scale = 1;  // bytes per count for the DRAM events
};

perf_event_attr make_attr(const EventSpec& e) {
  perf_event_attr a;
  std::memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.type = e.type;
  a.config = e.config;
  a.config1 = e.config1;
  a.config2 = e.config2;
  a.disabled = 1;
  a.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
  if (!e.system_wide) {
    a.inherit = 1;  // threads the counted thread creates during the interval are counted too
    a.exclude_kernel = e.exclude_kernel ? 1 : 0;
    a.exclude_hv = 1;
  }
  return a;
}

// The count of an open event, scaled up when the kernel multiplexed it (nullopt: never scheduled).
std::optional<double> read_count(int fd) {
  uint64_t v[3] = {0, 0, 0};  // value, time enabled, time running
  if (::read(fd, v, sizeof v) != static_cast<ssize_t>(sizeof v)) return std::nullopt;
  if (v[2] == 0) return v[1] == 0 ? std::optional<double>(0.0) : std::nullopt;
  return static_cast<double>(v[0]) * (v[2] < v[1] ? static_cast<double>(v[1]) / static_cast<double>(v[2]) : 1.0);
}

std::vector<pid_t> process_threads() {
  std::vector<pid_t> tids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc/self/task", ec)) {
    try {
      tids.push_back(static_cast<pid_t>(std::stol(entry.path().filename().string())));
    } catch (const std::exception&) {
    }
  }
  if (tids.empty()) tids.push_back(static_cast<pid_t>(::getpid()));
  return tids;
}

class PerfEventSession final : public CounterSession {
 public:
  PerfEventSession(double peak_bandwidth, const std::string& devices_dir, bool phases)
      : peak_bandwidth_(peak_bandwidth), phases_on_(phases) {
    paranoid_ = perf::read_paranoid();
    privileged_ = has_capability(38) || has_capability(21);
    paranoid_note_ = paranoid_ ? fmt::format("perf_event_paranoid={}", *paranoid_)
                               : std::string("no /proc/sys/kernel/perf_event_paranoid (a kernel without perf events)");
    if (privileged_) paranoid_note_ += " (overridden: CAP_PERFMON or CAP_SYS_ADMIN held)";
    // At 2 and above an unprivileged process may count user space only.
    const bool exclude_kernel = !privileged_ && paranoid_.value_or(2) >= 2;
    const std::vector<std::pair<EventSpec, std::string*>> per_thread = {
        {{"cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, 0, 0, false, exclude_kernel}, &cycles_reason_},
        {{"instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, 0, 0, false, exclude_kernel},
         &instructions_reason_},
        {{"task-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, 0, 0, false, exclude_kernel},
         &task_clock_reason_},
    };
    for (const auto& [spec, reason] : per_thread) {
      perf_event_attr attr = make_attr(spec);
      const int fd = perf_event_open(&attr, 0, -1);
      if (fd >= 0) {
        ::close(fd);
        thread_events_.push_back(spec);
      } else {
        *reason = open_failure(spec.name, errno, devices_dir);
      }
    }
    user_only_ = exclude_kernel;

    // DRAM traffic: system-wide uncore events, one per PMU and CPU of its cpumask.
    std::string why;
    const std::vector<perf::SysfsEvent> dram = perf::find_dram_events(devices_dir, &why);
    if (dram.empty()) {
      memory_reason_ = "n/a: no PMU event for DRAM traffic on this CPU (" + why + ")";
    } else if (!privileged_ && paranoid_.value_or(3) > 0) {
      memory_reason_ = fmt::format(
          "n/a: DRAM traffic is counted by system-wide uncore events ({}/{}), which need perf_event_paranoid <= 0 "
          "or CAP_PERFMON: {}",
          dram.front().pmu, dram.front().name, paranoid_note_);
    } else {
      std::vector<EventSpec> specs;
      for (const perf::SysfsEvent& e : dram) {
        for (int cpu : e.cpus) {
          EventSpec spec{e.pmu + "/" + e.name, e.type, e.config, e.config1, e.config2, true, false, e.bytes_per_count};
          perf_event_attr attr = make_attr(spec);
          const int fd = perf_event_open(&attr, -1, cpu);
          if (fd < 0) {
            memory_reason_ = fmt::format("n/a: perf_event_open({}) on CPU {} failed: {}, {}", spec.name, cpu,
                                         errno_name(errno), paranoid_note_);
            specs.clear();
            break;
          }
          ::close(fd);
          dram_cpus_.push_back(cpu);
          specs.push_back(spec);
        }
        if (!memory_reason_.empty()) break;
      }
      dram_events_ = specs;
      std::set<std::string> pmus;
      for (const auto& e : dram) pmus.insert(e.pmu);
      dram_source_ = fmt::format("{} PMU{} ({}, ...)", pmus.size(), pmus.size() == 1 ? "" : "s", *pmus.begin());
    }
    if (!dram_events_.empty() && peak_bandwidth_ <= 0) {
      memory_reason_ = "n/a: DRAM bytes counted, but no peak bandwidth was given to divide them by";
    }
    if (thread_events_.empty() && dram_events_.empty()) {
      reason_ = "n/a: " + (task_clock_reason_.empty() ? cycles_reason_ : task_clock_reason_);
    }
  }

  ~PerfEventSession() override { close_all(); }

  bool available() const override { return reason_.empty(); }
  std::string reason() const override { return reason_; }

  void start() override {
    close_all();
    // One counter per thread alive now; inherit covers the threads they start meanwhile.
    const std::vector<pid_t> tids = process_threads();
    threads_ = 0;
    for (pid_t tid : tids) {
      bool any = false;
      for (size_t i = 0; i < thread_events_.size(); ++i) {
        perf_event_attr attr = make_attr(thread_events_[i]);
        const int fd = perf_event_open(&attr, tid, -1);
        if (fd >= 0) {
          open_.push_back({fd, i, false});
          any = true;
        }  // a thread that ended since the listing: nothing to count
      }
      threads_ += any ? 1 : 0;
    }
    for (size_t i = 0; i < dram_events_.size(); ++i) {
      perf_event_attr attr = make_attr(dram_events_[i]);
      const int fd = perf_event_open(&attr, -1, dram_cpus_[i]);
      if (fd >= 0) open_.push_back({fd, i, true});
    }
    start_ = std::chrono::steady_clock::now();
    phases_.clear();
    current_phase_ = -1;
    for (const Open& o : open_) {
      ioctl(o.fd, PERF_EVENT_IOC_RESET, 0);
      ioctl(o.fd, PERF_EVENT_IOC_ENABLE, 0);
    }
    started_ = true;
    mark_ = Snapshot{};  // every counter reads 0 after the reset
    mark_time_ = start_;
  }

  void phase(const std::string& name) override {
    if (!phases_on_ || !started_) return;
    const auto now = std::chrono::steady_clock::now();
    if (current_phase_ >= 0) {
      // The segment since the last boundary belongs to the current phase.
      Snapshot snap = snapshot();
      close_segment(snap, now);
    }  // the first phase() also takes the work since start(): no boundary yet
    auto it = std::find_if(phases_.begin(), phases_.end(), [&](const PhaseSums& p) { return p.name == name; });
    if (it == phases_.end()) {
      PhaseSums fresh;
      fresh.name = name;
      phases_.push_back(std::move(fresh));
      it = std::prev(phases_.end());
    }
    current_phase_ = it - phases_.begin();
    it->segments += 1;
  }

  CounterReading stop() override {
    for (const Open& o : open_) ioctl(o.fd, PERF_EVENT_IOC_DISABLE, 0);
    const auto end = std::chrono::steady_clock::now();
    CounterReading r;
    r.source = "perf_event";
    r.seconds = started_ ? std::chrono::duration<double>(end - start_).count() : 0;
    Snapshot total = snapshot();
    const size_t dram_opened = std::count_if(open_.begin(), open_.end(), [](const Open& o) { return o.system_wide; });
    if (started_ && current_phase_ >= 0) close_segment(total, end);
    close_all();

    std::vector<std::string> reasons;
    auto take = [&](const std::string& name, std::optional<double>& out, const std::string& absent, double scale) {
      const bool counted =
          std::any_of(thread_events_.begin(), thread_events_.end(), [&](const EventSpec& e) { return e.name == name; });
      if (!counted) {
        reasons.push_back(name + ": " + absent);
      } else if (!started_) {
        reasons.push_back(name + ": n/a: stop() without start()");
      } else if (total.unread.count(name)) {
        reasons.push_back(name + ": n/a: a thread's counter was never scheduled (all PMU counters busy)");
      } else {
        out = total.sums[name] * scale;
      }
    };
    take("cycles", r.cycles, cycles_reason_, 1.0);
    take("instructions", r.instructions, instructions_reason_, 1.0);
    take("task-clock", r.cpu_seconds, task_clock_reason_, 1e-9);

    if (!dram_events_.empty() && started_ && total.dram_read == dram_opened && dram_opened == dram_events_.size()) {
      r.dram_bytes = total.dram_bytes;
      if (peak_bandwidth_ > 0 && r.seconds > 0) r.memory_bandwidth = total.dram_bytes / r.seconds / peak_bandwidth_;
    }
    r.memory_reason = r.memory_bandwidth ? ""
                      : !memory_reason_.empty()
                          ? memory_reason_
                          : "n/a: the DRAM counters could not be opened or read at start()/stop()";
    r.tensor_reason = "n/a: no tensor pipe is counted on a CPU";
    r.fp_reason =
        "n/a: no FP-operation event is read on a CPU (perf's generic events have none; model-specific raw events are "
        "not decoded)";
    std::vector<std::string> all = {"memory bandwidth: " + r.memory_reason, "tensor core: " + r.tensor_reason,
                                    "fp engine: " + r.fp_reason};
    all.insert(all.end(), reasons.begin(), reasons.end());
    r.reason = fmt::format("{}", fmt::join(all, "; "));

    std::vector<std::string> names;
    for (const EventSpec& e : thread_events_) names.push_back(e.name);
    r.detail =
        fmt::format("perf_event: {} over {} thread{} (inherit: and the threads they started){}", fmt::join(names, ", "),
                    threads_, threads_ == 1 ? "" : "s", user_only_ ? ", user space only (" + paranoid_note_ + ")" : "");
    if (!dram_events_.empty()) {
      r.detail += fmt::format("; DRAM: {} read+write events of {}, whole socket (every process)", dram_events_.size(),
                              dram_source_);
    }
    // Each phase's columns where the interval has them (the same counters, read at its boundaries).
    for (const PhaseSums& p : started_ ? phases_ : std::vector<PhaseSums>{}) {
      PhaseCounters out;
      out.name = p.name;
      out.segments = p.segments;
      out.seconds = p.seconds;
      auto from = [&](const std::optional<double>& whole, const std::string& event, double scale) {
        const auto it = p.sums.find(event);
        return whole && it != p.sums.end() ? std::optional<double>(it->second * scale) : std::nullopt;
      };
      out.cycles = from(r.cycles, "cycles", 1.0);
      out.instructions = from(r.instructions, "instructions", 1.0);
      out.cpu_seconds = from(r.cpu_seconds, "task-clock", 1e-9);
      if (r.dram_bytes) {
        out.dram_bytes = p.dram_bytes;
        if (peak_bandwidth_ > 0 && p.seconds > 0) out.memory_bandwidth = p.dram_bytes / p.seconds / peak_bandwidth_;
      }
      r.phases.push_back(std::move(out));
    }
    if (!r.phases.empty()) r.detail += fmt::format("; per phase: read at each of its {} boundaries", boundaries_);
    started_ = false;
    return r;
  }

 private:
  struct Open {
    int fd;
    size_t index;
    bool system_wide;
  };

  void close_all() {
    for (const Open& o : open_) ::close(o.fd);
    open_.clear();
  }

  // Every open counter read once: per-thread events summed by name, DRAM bytes summed.
  struct Snapshot {
    std::map<std::string, double> sums;
    std::set<std::string> unread;
    double dram_bytes = 0;
    size_t dram_read = 0;
  };
  Snapshot snapshot() const {
    Snapshot s;
    for (const Open& o : open_) {
      const std::optional<double> count = read_count(o.fd);
      if (o.system_wide) {
        if (count) {
          s.dram_bytes += *count * dram_events_[o.index].scale;
          ++s.dram_read;
        }
      } else if (count) {
        s.sums[thread_events_[o.index].name] += *count;
      } else {
        s.unread.insert(thread_events_[o.index].name);
      }
    }
    return s;
  }

  // The counts since the last boundary go to the current phase; `snap` becomes the boundary.
  void close_segment(const Snapshot& snap, std::chrono::steady_clock::time_point now) {
    PhaseSums& p = phases_[static_cast<size_t>(current_phase_)];
    for (const auto& [event, value] : snap.sums) {
      const auto before = mark_.sums.find(event);
      p.sums[event] += value - (before == mark_.sums.end() ? 0.0 : before->second);
    }
    p.dram_bytes += snap.dram_bytes - mark_.dram_bytes;
    p.seconds += std::chrono::duration<double>(now - mark_time_).count();
    mark_ = snap;
    mark_time_ = now;
    ++boundaries_;
  }

  struct PhaseSums {
    std::string name;
    int64_t segments = 0;
    double seconds = 0, dram_bytes = 0;
    std::map<std::string, double> sums;
  };

  std::string open_failure(const std::string& event, int err, const std::string& devices_dir) const {
    std::string why;
    if (err == ENOENT || err == ENODEV || err == EOPNOTSUPP) {
      why = fs::exists(fs::path(devices_dir) / "cpu") ? "the CPU's PMU does not count it"
                                                      : "no hardware PMU exposed to this kernel: " + devices_dir +
                                                            " has no cpu (a virtual machine without PMU pass-through?)";
      if (event == "task-clock") why = "software events unavailable";
    } else if (err == EACCES || err == EPERM) {
      why = "refused (a container's seccomp profile may block perf_event_open)";
    } else if (err == ENOSYS) {
      why = "perf_event_open is not available (kernel without perf events, or blocked)";
    } else {
      why = "failed";
    }
    return fmt::format("n/a: perf_event_open({}): {}: {}, {}", event, errno_name(err), why, paranoid_note_);
  }

  double peak_bandwidth_ = 0;
  bool phases_on_ = false;
  std::optional<int> paranoid_;
  bool privileged_ = false, user_only_ = false;
  std::string paranoid_note_;
  std::string reason_, cycles_reason_, instructions_reason_, task_clock_reason_, memory_reason_, dram_source_;
  std::vector<EventSpec> thread_events_, dram_events_;
  std::vector<int> dram_cpus_;
  std::vector<Open> open_;
  size_t threads_ = 0;
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
  // Phases (CounterOptions::phases): in the order first entered; the current one's index, -1
  // before the first phase(); the counts and time at the last boundary.
  std::vector<PhaseSums> phases_;
  std::ptrdiff_t current_phase_ = -1;
  Snapshot mark_;
  std::chrono::steady_clock::time_point mark_time_;
  int64_t boundaries_ = 0;
};

}  // namespace

namespace perf {

std::optional<int> read_paranoid() {
  const std::optional<std::string> text = read_text("/proc/sys/kernel/perf_event_paranoid");
  if (!text) return std::nullopt;
  try {
    return std::stoi(*text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<SysfsEvent> read_sysfs_event(const std::string& pmu_dir, const std::string& event, std::string* error) {
  const fs::path dir(pmu_dir);
  auto fail = [&](const std::string& what) -> std::optional<SysfsEvent> {
    if (error) *error = (dir / "").string() + ": " + what;
    return std::nullopt;
  };
  SysfsEvent out;
  out.pmu = dir.filename().string();
  out.name = event;
  const std::optional<std::string> type = read_text(dir / "type");
  if (!type) return fail("no type file");
  try {
    out.type = static_cast<uint32_t>(std::stoul(*type));
  } catch (const std::exception&) {
    return fail("type '" + *type + "' is not a number");
  }
  const std::optional<std::string> terms = read_text(dir / "events" / event);
  if (!terms) return fail("no events/" + event);
  for (const std::string& term : split(*terms, ',')) {
    if (term.empty()) continue;
    const auto eq = term.find('=');
    const std::string field = term.substr(0, eq);
    uint64_t value = 1;
    if (eq != std::string::npos) {
      try {
        value = std::stoull(term.substr(eq + 1), nullptr, 0);
      } catch (const std::exception&) {
        return fail("events/" + event + ": '" + term + "' has no number");
      }
    }
    // format/<field>: "config:0-7", "config1:0-15", "config:0-7,32-35", "config:21"
    const std::optional<std::string> format = read_text(dir / "format" / field);
    if (!format) return fail("no format/" + field);
    const auto colon = format->find(':');
    if (colon == std::string::npos) return fail("format/" + field + " '" + *format + "' names no config word");
    const std::string word = format->substr(0, colon);
    uint64_t* target = word == "config"    ? &out.config
                       : word == "config1" ? &out.config1
                       : word == "config2" ? &out.config2
                                           : nullptr;
    if (!target) return fail("format/" + field + " names '" + word + "'");
    const std::optional<std::vector<int>> bits = parse_cpu_list(format->substr(colon + 1));  // same "a-b,c" syntax
    if (!bits || bits->empty()) return fail("format/" + field + " '" + *format + "' has no bit range");
    if (bits->size() < 64 && (value >> bits->size()) != 0) {
      return fail(fmt::format("events/{}: {} does not fit format/{} ({} bits)", event, term, field, bits->size()));
    }
    for (size_t i = 0; i < bits->size(); ++i) {
      if ((*bits)[i] > 63) return fail("format/" + field + " '" + *format + "' has a bit past 63");
      if ((value >> i) & 1ULL) *target |= 1ULL << (*bits)[i];
    }
  }
  double scale = 1;
  if (const auto s = read_text(dir / "events" / (event + ".scale"))) {
    try {
      scale = std::stod(*s);
    } catch (const std::exception&) {
      return fail("events/" + event + ".scale '" + *s + "' is not a number");
    }
  }
  double unit = 1;
  if (const auto u = read_text(dir / "events" / (event + ".unit"))) {
    static const std::map<std::string, double> units = {{"Bytes", 1},   {"bytes", 1},     {"B", 1},
                                                        {"KiB", 1024.}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
                                                        {"KB", 1e3},    {"MB", 1e6},      {"GB", 1e9}};
    const auto it = units.find(*u);
    if (it == units.end()) return fail("events/" + event + ".unit '" + *u + "' is not a unit of bytes");
    unit = it->second;
  }
  out.bytes_per_count = scale * unit;
  if (const auto mask = read_text(dir / "cpumask")) {
    const auto cpus = parse_cpu_list(*mask);
    if (!cpus) return fail("cpumask '" + *mask + "' is malformed");
    out.cpus = *cpus;
  }
  if (out.cpus.empty()) out.cpus = {0};
  return out;
}

std::vector<SysfsEvent> find_dram_events(const std::string& devices_dir, std::string* why) {
  std::vector<std::string> pmus;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(devices_dir, ec)) pmus.push_back(entry.path().filename().string());
  std::sort(pmus.begin(), pmus.end());
  std::vector<SysfsEvent> out;
  std::string first_error;
  // Free-running counters first where both exist (they need no programming and never multiplex).
  for (const auto& [prefix, read, write] :
       {std::tuple<std::string, std::string, std::string>{"uncore_imc_free_running_", "data_read", "data_write"},
        {"uncore_imc_", "cas_count_read", "cas_count_write"}}) {
    for (const std::string& pmu : pmus) {
      if (pmu.rfind(prefix, 0) != 0) continue;
      if (prefix == "uncore_imc_" && pmu.rfind("uncore_imc_free_running_", 0) == 0) continue;
      for (const std::string& name : {read, write}) {
        std::string error;
        if (auto e = read_sysfs_event((fs::path(devices_dir) / pmu).string(), name, &error)) {
          out.push_back(*e);
        } else if (first_error.empty()) {
          first_error = error;
        }
      }
    }
    if (!out.empty()) return out;
  }
  if (why) {
    if (!first_error.empty()) {
      *why = first_error;
    } else if (std::any_of(pmus.begin(), pmus.end(), [](const std::string& p) {
                 return p.rfind("amd_df", 0) == 0 || p.rfind("amd_umc", 0) == 0;
               })) {
      *why = "amd_df/amd_umc present, but their DRAM events are not named in sysfs on this kernel";
    } else if (ec) {
      *why = devices_dir + " cannot be read";
    } else {
      *why = fmt::format("no uncore_imc PMU in {}, which has: {}", devices_dir,
                         pmus.empty() ? "nothing" : fmt::format("{}", fmt::join(pmus, ", ")));
    }
  }
  return out;
}

}  // namespace perf

std::unique_ptr<CounterSession> open_perf_event_session(double peak_bandwidth_bytes_per_s,
                                                        const std::string& devices_dir, const CounterOptions& options) {
  return std::make_unique<PerfEventSession>(peak_bandwidth_bytes_per_s, devices_dir, options.phases);
}

}  // namespace kiln::profile
