// Where a process sits in a job, from torchrun's and Slurm's variables (kiln/dist/env.h).
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "kiln/dist/env.h"
#include "support.h"

using kiln::dist::read_dist_env;

namespace {
auto from(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}
}  // namespace

TEST_CASE("no launcher variables: one process", "[dist]") {
  const auto env = read_dist_env(from({}));
  CHECK(env.launcher == "none");
  CHECK(env.world_size == 1);
  CHECK_FALSE(env.distributed());
}

TEST_CASE("torchrun's variables, with and without its agent store", "[dist]") {
  auto env = read_dist_env(from({{"RANK", "3"},
                                 {"LOCAL_RANK", "1"},
                                 {"WORLD_SIZE", "8"},
                                 {"LOCAL_WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "node7"},
                                 {"MASTER_PORT", "29511"},
                                 {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                 {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  CHECK(env.launcher == "torchrun");
  CHECK(env.rank == 3);
  CHECK(env.local_rank == 1);
  CHECK(env.world_size == 8);
  CHECK(env.local_world_size == 2);
  CHECK(env.master_addr == "node7");
  CHECK(env.master_port == 29511);
  CHECK(env.agent_store);
  CHECK(env.restart_count == 2);
  CHECK(env.distributed());
  // A plain launch (python -m torch.distributed.launch, or by hand): rank 0 hosts the store.
  env =
      read_dist_env(from({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}}));
  CHECK_FALSE(env.agent_store);
  CHECK(env.distributed());  // launched, even alone: the job runs through c10d
}

TEST_CASE("Slurm's variables: first host of the node list, port from the job id", "[dist]") {
  const auto env = read_dist_env(from({{"SLURM_PROCID", "5"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_NTASKS", "8"},
                                       {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                       {"SLURM_JOB_NODELIST", "gpu[07-08],cpu1"},
                                       {"SLURM_JOB_ID", "123456"}}));
  CHECK(env.launcher == "slurm");
  CHECK(env.rank == 5);
  CHECK(env.local_rank == 1);
  CHECK(env.world_size == 8);
  CHECK(env.local_world_size == 4);
  CHECK(env.master_addr == "gpu07");
  CHECK(env.master_port == 15000 + 123456 % 10000);
  // MASTER_ADDR / MASTER_PORT win when the job script sets them.
  const auto set = read_dist_env(from({{"SLURM_PROCID", "0"},
                                       {"SLURM_NTASKS", "2"},
                                       {"SLURM_JOB_NODELIST", "a"},
                                       {"MASTER_ADDR", "10.0.0.1"},
                                       {"MASTER_PORT", "4242"}}));
  CHECK(set.master_addr == "10.0.0.1");
  CHECK(set.master_port == 4242);
}

TEST_CASE("Slurm host lists", "[dist]") {
  using kiln::dist::first_slurm_host;
  CHECK(first_slurm_host("node[01-04,07],gpu-a") == "node01");
  CHECK(first_slurm_host("node[3,5]") == "node3");
  CHECK(first_slurm_host("a,b") == "a");
  CHECK(first_slurm_host("host") == "host");
  CHECK(first_slurm_host("rack[2-3]-n[1-4]") == "rack2-n1");
  CHECK_THROWS_WITH(first_slurm_host("node[01-04"), Catch::Contains("unmatched"));
}

TEST_CASE("malformed launcher variables name the variable", "[dist]") {
  const auto error = [](std::map<std::string, std::string> vars) {
    return kiln::test::error_of([&] { read_dist_env(from(vars)); });
  };
  CHECK_THAT(error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
             Catch::Contains("RANK") && Catch::Contains("[0, 1]"));
  CHECK_THAT(error({{"RANK", "0"}, {"WORLD_SIZE", "two"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
             Catch::Contains("WORLD_SIZE='two'"));
  CHECK_THAT(error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}), Catch::Contains("MASTER_ADDR"));
  CHECK_THAT(error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}}),
             Catch::Contains("MASTER_PORT"));
  CHECK_THAT(error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a"}}),
             Catch::Contains("SLURM_JOB_ID"));
  CHECK_THAT(error({{"RANK", "0"},
                    {"LOCAL_RANK", "2"},
                    {"LOCAL_WORLD_SIZE", "2"},
                    {"WORLD_SIZE", "4"},
                    {"MASTER_ADDR", "a"},
                    {"MASTER_PORT", "1"}}),
             Catch::Contains("local rank 2"));
}

TEST_CASE("each rank's CPU threads: its share of the host, not every core", "[dist]") {
  using kiln::dist::rank_cpu_threads;
  const auto slurm = [](std::map<std::string, std::string> extra) {
    std::map<std::string, std::string> vars = {{"SLURM_PROCID", "1"},        {"SLURM_NTASKS", "2"},
                                               {"SLURM_LOCALID", "1"},       {"SLURM_NTASKS_PER_NODE", "2"},
                                               {"SLURM_JOB_NODELIST", "n1"}, {"SLURM_JOB_ID", "7"}};
    vars.insert(extra.begin(), extra.end());
    return read_dist_env(from(vars));
  };
  // srun -n 2 --cpus-per-task 1 on 2 cores, no binding (task/none): 1 thread each, not 2.
  const auto env = slurm({{"SLURM_CPUS_PER_TASK", "1"}});
  CHECK(env.cpus_per_task == 1);
  CHECK(rank_cpu_threads(env, std::nullopt, 2, 2) == 1);
  // OMP_NUM_THREADS wins (the user's, or torchrun's 1).
  CHECK(rank_cpu_threads(env, 3, 2, 2) == 3);
  // --cpus-per-task larger than the CPUs the rank is bound to: the binding.
  CHECK(rank_cpu_threads(slurm({{"SLURM_CPUS_PER_TASK", "8"}}), std::nullopt, 4, 64) == 4);
  // No --cpus-per-task: a binding is the rank's share; without one, the host's CPUs over its ranks.
  CHECK(rank_cpu_threads(slurm({}), std::nullopt, 6, 64) == 6);
  CHECK(rank_cpu_threads(slurm({}), std::nullopt, 64, 64) == 32);
  CHECK(rank_cpu_threads(slurm({{"SLURM_NTASKS", "8"}, {"SLURM_NTASKS_PER_NODE", "8"}}), std::nullopt, 2, 2) == 1);
  // torchrun without OMP_NUM_THREADS: the host's CPUs over LOCAL_WORLD_SIZE.
  const auto torchrun = read_dist_env(from(
      {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
  CHECK(rank_cpu_threads(torchrun, std::nullopt, 16, 16) == 4);
  // A process alone keeps LibTorch's default.
  CHECK(rank_cpu_threads(read_dist_env(from({})), std::nullopt, 16, 16) == 0);
  CHECK_THROWS_WITH(slurm({{"SLURM_CPUS_PER_TASK", "0"}}), Catch::Contains("SLURM_CPUS_PER_TASK"));
}
