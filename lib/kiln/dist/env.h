// Where this process sits in a data-parallel job, read from the launcher's environment
// (docs/distributed.md). No LibTorch here: a pure function of the variables, tested directly.
//
// - torchrun (and torch.distributed.launch): RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
//   MASTER_ADDR, MASTER_PORT; TORCHELASTIC_USE_AGENT_STORE=True means torchrun's agent already
//   hosts the TCPStore on MASTER_PORT (join it as a client, never host one); TORCHELASTIC_RESTART_COUNT
//   prefixes the store's keys so a restarted group never reads the previous attempt's keys.
// - Slurm (srun): SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE or
//   SLURM_TASKS_PER_NODE, the first host of SLURM_JOB_NODELIST (or SLURM_NODELIST) as the store's
//   host, and a port derived from SLURM_JOB_ID (15000 + job id % 10000, as PyTorch Lightning's
//   convention) unless MASTER_PORT is set. MASTER_ADDR, when set, overrides the host.
// - Neither: one process (world size 1), no process group, as kiln has always run.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace kiln::dist {

struct DistEnv {
  std::string launcher = "none";  // "torchrun", "slurm" or "none"
  int rank = 0, local_rank = 0, world_size = 1, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool agent_store = false;  // torchrun's agent hosts the store on master_port
  int restart_count = 0;     // torchrun restarts: a fresh key prefix per attempt
  int cpus_per_task = 0;     // SLURM_CPUS_PER_TASK (srun --cpus-per-task); 0 when not given
  bool distributed() const { return world_size > 1 || launcher != "none"; }
};

// Reads the variables through `getenv` (by default common/env.h's env::raw: the value as set, ""
// included). Throws std::runtime_error naming the variable for a malformed or inconsistent value
// (e.g. RANK >= WORLD_SIZE).
DistEnv read_dist_env(const std::function<std::optional<std::string>(const std::string&)>& getenv = {});

// The intra-op threads one rank of a job runs, so that the ranks on a host share its CPUs instead
// of each taking all of them: OMP_NUM_THREADS when set (the user's, or torchrun's 1); else
// SLURM_CPUS_PER_TASK (within the affinity mask); else the affinity mask when the launcher bound
// the rank to fewer CPUs than the machine has; else the machine's CPUs shared among the host's
// ranks (local_world_size), at least 1. 0 for a process alone (no launcher): LibTorch's default.
int rank_cpu_threads(const DistEnv& env, std::optional<int> omp_num_threads, int affinity_cpus, int machine_cpus);

// CPUs in this process's affinity mask (sched_getaffinity) and the machine's online CPUs.
int affinity_cpu_count();
int online_cpu_count();

// "node[01-04,07],gpu-a" -> "node01"; "a,b" -> "a"; "host" -> "host" (Slurm's hostlist syntax).
std::string first_slurm_host(const std::string& nodelist);

}  // namespace kiln::dist
