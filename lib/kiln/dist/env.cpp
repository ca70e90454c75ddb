#include "kiln/dist/env.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/common/env.h"

namespace kiln::dist {

namespace {

int parse_int(const std::string& name, const std::string& value, int lo, int hi) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < lo || v > hi) {
    throw std::runtime_error(
        fmt::format("environment variable {}='{}': expected an integer in [{}, {}]", name, value, lo, hi));
  }
  return static_cast<int>(v);
}

}  // namespace

int rank_cpu_threads(const DistEnv& env, std::optional<int> omp_num_threads, int affinity_cpus, int machine_cpus) {
  if (omp_num_threads && *omp_num_threads > 0) return *omp_num_threads;
  if (!env.distributed()) return 0;
  affinity_cpus = std::max(affinity_cpus, 1);
  if (env.cpus_per_task > 0) return std::min(env.cpus_per_task, affinity_cpus);
  if (affinity_cpus < machine_cpus) return affinity_cpus;
  return std::max(affinity_cpus / std::max(env.local_world_size, 1), 1);
}

int affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return online_cpu_count();
  return std::max(CPU_COUNT(&set), 1);
}

int online_cpu_count() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at the first comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  // Every bracket group "[01-04,07]" becomes its first value, keeping its zero padding.
  std::string host;
  for (size_t i = 0; i < first.size();) {
    if (first[i] != '[') {
      host += first[i++];
      continue;
    }
    const size_t close = first.find(']', i);
    if (close == std::string::npos) {
      throw std::runtime_error(fmt::format("SLURM_JOB_NODELIST '{}': unmatched '['", nodelist));
    }
    const std::string inner = first.substr(i + 1, close - i - 1);
    host += inner.substr(0, inner.find_first_of(",-"));
    i = close + 1;
  }
  return host;
}

DistEnv read_dist_env(const std::function<std::optional<std::string>(const std::string&)>& getenv_fn) {
  const auto get = [&](const std::string& name) -> std::optional<std::string> {
    if (getenv_fn) return getenv_fn(name);
    return kiln::env::raw(name.c_str());  // the launchers' protocol: "" is a value (of a malformed job)
  };
  DistEnv env;
  constexpr int kMaxRanks = 1 << 20;
  if (const auto world = get("WORLD_SIZE"); world && get("RANK")) {
    env.launcher = "torchrun";
    env.world_size = parse_int("WORLD_SIZE", *world, 1, kMaxRanks);
    env.rank = parse_int("RANK", *get("RANK"), 0, env.world_size - 1);
    env.local_rank = get("LOCAL_RANK") ? parse_int("LOCAL_RANK", *get("LOCAL_RANK"), 0, kMaxRanks) : env.rank;
    env.local_world_size = get("LOCAL_WORLD_SIZE")
                               ? parse_int("LOCAL_WORLD_SIZE", *get("LOCAL_WORLD_SIZE"), 1, kMaxRanks)
                               : env.world_size;
    if (!get("MASTER_ADDR") || !get("MASTER_PORT")) {
      throw std::runtime_error(
          "RANK and WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not (launch with torchrun)");
    }
    env.master_addr = *get("MASTER_ADDR");
    env.master_port = parse_int("MASTER_PORT", *get("MASTER_PORT"), 1, 65535);
    const auto agent = get("TORCHELASTIC_USE_AGENT_STORE");
    env.agent_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");
    if (const auto restarts = get("TORCHELASTIC_RESTART_COUNT")) {
      env.restart_count = parse_int("TORCHELASTIC_RESTART_COUNT", *restarts, 0, kMaxRanks);
    }
  } else if (const auto procid = get("SLURM_PROCID"); procid && get("SLURM_NTASKS")) {
    env.launcher = "slurm";
    env.world_size = parse_int("SLURM_NTASKS", *get("SLURM_NTASKS"), 1, kMaxRanks);
    env.rank = parse_int("SLURM_PROCID", *procid, 0, env.world_size - 1);
    env.local_rank = get("SLURM_LOCALID") ? parse_int("SLURM_LOCALID", *get("SLURM_LOCALID"), 0, kMaxRanks) : 0;
    // SLURM_TASKS_PER_NODE is "4(x2)" or "4,3": the first node's count is this one's when uniform.
    if (const auto per_node = get("SLURM_NTASKS_PER_NODE")) {
      env.local_world_size = parse_int("SLURM_NTASKS_PER_NODE", *per_node, 1, kMaxRanks);
    } else if (const auto tasks = get("SLURM_TASKS_PER_NODE")) {
      const std::string first = tasks->substr(0, tasks->find_first_of("(,"));
      env.local_world_size = parse_int("SLURM_TASKS_PER_NODE", first, 1, kMaxRanks);
    } else {
      env.local_world_size = env.world_size;
    }
    if (const auto addr = get("MASTER_ADDR")) {
      env.master_addr = *addr;
    } else {
      const auto nodelist = get("SLURM_JOB_NODELIST") ? get("SLURM_JOB_NODELIST") : get("SLURM_NODELIST");
      if (!nodelist) throw std::runtime_error("SLURM_PROCID is set but SLURM_JOB_NODELIST is not (and no MASTER_ADDR)");
      env.master_addr = first_slurm_host(*nodelist);
    }
    if (const auto port = get("MASTER_PORT")) {
      env.master_port = parse_int("MASTER_PORT", *port, 1, 65535);
    } else {
      const auto job = get("SLURM_JOB_ID");
      if (!job) throw std::runtime_error("SLURM_PROCID is set but neither MASTER_PORT nor SLURM_JOB_ID is");
      env.master_port = 15000 + parse_int("SLURM_JOB_ID", *job, 0, 2147483647) % 10000;
    }
    if (const auto restarts = get("SLURM_RESTART_COUNT")) {
      env.restart_count = parse_int("SLURM_RESTART_COUNT", *restarts, 0, kMaxRanks);
    }
    if (const auto cpus = get("SLURM_CPUS_PER_TASK")) {
      env.cpus_per_task = parse_int("SLURM_CPUS_PER_TASK", *cpus, 1, kMaxRanks);
    }
  }
  if (env.local_rank >= env.local_world_size) {
    throw std::runtime_error(
        fmt::format("local rank {} is not below the local world size {}", env.local_rank, env.local_world_size));
  }
  return env;
}

}  // namespace kiln::dist
