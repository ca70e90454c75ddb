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
};

struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};  // ddp_timeout
  bool cuda = false;                                            // data group on NCCL
};

// Joins the job that `env` describes. Throws CommError naming the store address when the
// rendezvous fails within the timeout.
std::shared_ptr<Comm> connect(const DistEnv& env, const CommOptions& options);

}  // namespace kiln::dist
