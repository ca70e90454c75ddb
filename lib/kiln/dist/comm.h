// A data-parallel job's communicator on PyTorch's c10d (docs/distributed.md).
//
// Rendezvous through c10d::TCPStore (joined as a client under torchrun's agent store; hosted by
// rank 0 otherwise), then two process groups on it:
// - data: NCCL when the job trains on CUDA (one process per GPU, LOCAL_RANK picks it), Gloo on CPU;
//   gradients and parameters travel here, asynchronously where asked.
// - control: Gloo on CPU tensors, for small host values (token counts, stop requests, loss sums),
//   so agreeing on them never synchronises the host with a GPU stream.
// Every collective is bounded by the timeout (HF's ddp_timeout); a failed or timed-out collective
// throws CommError naming the operation, so a dead rank makes the others exit with a message.
//
// The NCCL group is bound to this rank's GPU and its communicator created in connect(), by every
// rank at the same point (as init_process_group(device_id=...)). The groups are torn down in a
// fixed order by shutdown() (normal exit) or abort() (an error), never left to destructors at exit.
//
// The c10d and gloo headers are included only by comm.cpp: the rest of kiln sees this interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kiln/dist/env.h"

namespace kiln::dist {

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective in flight. wait() blocks until it is done and throws CommError if it failed.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const DistEnv& env() const = 0;
  virtual std::string backend() const = 0;  // "gloo" or "nccl"

  // Data group. `t` is reduced in place (sum over ranks).
  virtual std::unique_ptr<Pending> all_reduce_sum(at::Tensor t) = 0;
  // out (world * n elements) gets every rank's `in` (n elements) in rank order.
  virtual std::unique_ptr<Pending> all_gather(at::Tensor out, at::Tensor in) = 0;
  // out (n elements) = sum over ranks of chunk `rank` of `in` (world * n elements).
  virtual std::unique_ptr<Pending> reduce_scatter_sum(at::Tensor out, at::Tensor in) = 0;
  virtual void broadcast(std::vector<at::Tensor> tensors, int root) = 0;

  // Control group, on the host: element-wise sum / max over ranks.
  virtual std::vector<double> host_sum(std::vector<double> values) = 0;
  virtual std::vector<int64_t> host_max(std::vector<int64_t> values) = 0;
  virtual void barrier() = 0;

  // Teardown, each rank on its own (docs/distributed.md, "Shutdown"). Both are idempotent; a
  // collective after either throws CommError. The destructor does abort() when it runs during an
  // exception's unwinding or after a collective failed, shutdown() otherwise, and never throws.
  //
  // shutdown(): the normal end, every collective of this rank waited for. The data group first
  // (NCCL: its communicator is flushed and destroyed, ncclCommFinalize and ncclCommDestroy), then
  // the control group, then the store. Throws CommError when NCCL reports an error (the rest is
  // still torn down).
  virtual void shutdown() = 0;
  // abort(): an error on this rank. The data group is aborted first (NCCL: ncclCommAbort, kernels
  // in flight end; bounded by the timeout), then the control group is closed (nothing of it is
  // ever in flight), so every other rank's next collective fails at once on the closed connections
  // instead of waiting for the timeout; then the Gloo data group (its queued collectives fail as
  // the others go), then the store.
  virtual void abort() = 0;
};

struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};  // ddp_timeout
  // This rank's GPU (LOCAL_RANK's): the data group is NCCL, bound to it. -1: CPU, Gloo.
  int cuda_device = -1;
};

// Joins the job that `env` describes. Throws CommError naming the store address when the
// rendezvous fails within the timeout.
std::shared_ptr<Comm> connect(const DistEnv& env, const CommOptions& options);

}  // namespace kiln::dist
