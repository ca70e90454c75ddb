// dist::Comm's teardown on c10d/Gloo, two ranks in two threads of this process on 127.0.0.1 (rank
// 0 hosts the TCPStore, as under srun): a rank that aborts makes the other's next collective fail at
// once, naming it, instead of after the timeout; a silent rank is seen through the timeout and
// the abort that follows does not wait a timeout again per queued collective; shutdown() is ordered,
// idempotent, and a collective after it is a CommError. Every wait here is bounded (the timeouts
// given to connect(), and a future's wait_for), so a regression fails instead of hanging.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "kiln/dist/comm.h"

using Catch::Matchers::Contains;
using kiln::dist::Comm;
using kiln::dist::CommError;
using Clock = std::chrono::steady_clock;

namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

kiln::dist::DistEnv env_of(int rank, int port) {
  kiln::dist::DistEnv env;
  env.launcher = "slurm";
  env.rank = env.local_rank = rank;
  env.world_size = env.local_world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs `rank1` in a thread as rank 1 and `rank0` here as rank 0, each on its own communicator
// (connect() needs both ranks at once). Rank 1's thread is joined within `bound_s`.
void two_ranks(std::chrono::milliseconds timeout, const std::function<void(Comm&)>& rank0,
               const std::function<void(Comm&)>& rank1, double bound_s = 30) {
  const int port = free_port();
  auto other = std::async(std::launch::async, [&] {
    auto comm = kiln::dist::connect(env_of(1, port), {.timeout = timeout});
    rank1(*comm);
  });
  {
    auto comm = kiln::dist::connect(env_of(0, port), {.timeout = timeout});
    rank0(*comm);
  }
  REQUIRE(other.wait_for(std::chrono::duration<double>(bound_s)) == std::future_status::ready);
  other.get();
}

}  // namespace

#ifdef KILN_WITH_DIST

TEST_CASE("collectives agree, shutdown is idempotent and a collective after it is a CommError", "[dist]") {
  auto body = [](Comm& comm) {
    at::Tensor t = at::full({4}, static_cast<float>(comm.rank() + 1));
    comm.all_reduce_sum(t)->wait();
    CHECK(at::equal(t, at::full({4}, 3.0f)));
    CHECK(comm.host_max({comm.rank()})[0] == 1);
    comm.barrier();
    comm.shutdown();
    comm.shutdown();  // a second time: nothing
    CHECK_THROWS_WITH(comm.host_sum({1.0}), Contains("the control group was shut down"));
    CHECK_THROWS_AS(comm.all_reduce_sum(t), CommError);
    comm.abort();  // after shutdown: nothing either
  };
  two_ranks(std::chrono::seconds(60), body, body);
}

TEST_CASE("a rank that aborts makes the other's next collective fail at once, naming it", "[dist]") {
  std::promise<void> aborted;
  auto waited = aborted.get_future();
  two_ranks(
      std::chrono::seconds(60),
      [&](Comm& comm) {
        comm.barrier();  // both joined
        REQUIRE(waited.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
        const auto t0 = Clock::now();
        CHECK_THROWS_WITH(comm.host_max({0}), Contains("all_reduce (max of host values) (rank 0 of 2) failed"));
        CHECK(seconds_since(t0) < 5);  // the closed connection, not the timeout of 60 s
        // The data group sees it too: it was closed with the others.
        at::Tensor t = at::ones({8});
        CHECK_THROWS_WITH(comm.all_reduce_sum(t)->wait(),
                          Contains("all_reduce on the gloo group (rank 0 of 2) failed"));
        CHECK(seconds_since(t0) < 5);
      },
      [&](Comm& comm) {
        comm.barrier();  // both joined
        comm.abort();
        aborted.set_value();
      });
}

TEST_CASE("a silent rank is seen after the timeout, and the abort after it does not wait again", "[dist]") {
  // Rank 1 joins, then neither calls a collective nor closes anything until rank 0 is done; rank
  // 0 has six all-reduces queued on the data group (two Gloo threads) when the first times out.
  std::promise<void> done;
  auto rank0_done = done.get_future();
  two_ranks(
      std::chrono::milliseconds(1500),
      [&](Comm& comm) {
        comm.barrier();
        std::vector<at::Tensor> buffers;
        std::vector<std::unique_ptr<kiln::dist::Pending>> pending;
        for (int i = 0; i < 6; ++i) {
          buffers.push_back(at::ones({1 << 10}));
          pending.push_back(comm.all_reduce_sum(buffers.back()));
        }
        const auto t0 = Clock::now();
        CHECK_THROWS_WITH(pending[0]->wait(), Contains("all_reduce on the gloo group (rank 0 of 2) failed"));
        const double first = seconds_since(t0);
        CHECK(first > 1.0);
        CHECK(first < 5.0);
        const auto t1 = Clock::now();
        comm.abort();  // releases the data group: its queue drains as failures, not as 5 more timeouts
        CHECK(seconds_since(t1) < 1.0);
        done.set_value();
      },
      [&](Comm& comm) {
        comm.barrier();
        REQUIRE(rank0_done.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
        comm.abort();
      });
}

#else

TEST_CASE("without gloo's headers a launcher's environment is refused naming the rank", "[dist]") {
  CHECK_THROWS_WITH(kiln::dist::connect(env_of(1, 29500), {}), Contains("rank 1 of 2 (slurm)"));
}

#endif
