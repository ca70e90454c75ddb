// c10d behind kiln::dist::Comm. The only file of kiln that includes c10d's process-group headers
// (and through them gloo's, from Debian's libgloo-dev: the wheel ships none).
#include "kiln/dist/comm.h"

#include <atomic>
#include <cstdlib>
#include <exception>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/common/env.h"

#ifdef KILN_WITH_DIST
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef KILN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#endif

namespace kiln::dist {

#ifdef KILN_WITH_DIST
namespace {

// Set by any collective of a communicator that failed: its groups can no longer be shut down
// cleanly (an NCCL shutdown would wait for kernels that never end), so the destructor aborts.
using FailedFlag = std::shared_ptr<std::atomic<bool>>;

class WorkPending final : public Pending {
 public:
  WorkPending(c10::intrusive_ptr<c10d::Work> work, std::string what, FailedFlag failed)
      : work_(std::move(work)), what_(std::move(what)), failed_(std::move(failed)) {}
  void wait() override {
    if (!work_) return;
    try {
      work_->wait();
    } catch (const std::exception& e) {
      work_.reset();
      failed_->store(true);
      throw CommError(fmt::format("{} failed: {}", what_, e.what()));
    }
    work_.reset();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  FailedFlag failed_;
};

std::shared_ptr<::gloo::transport::Device> gloo_device(const DistEnv& env) {
  // Gloo's convention: GLOO_SOCKET_IFNAME names the interface (several nodes); otherwise the
  // address that reaches the store's host (one node: loopback).
  if (const auto ifname = kiln::env::string("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(*ifname);
  }
  if (env.world_size > env.local_world_size) return c10d::ProcessGroupGloo::createDefaultDevice();
  return c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr);
}

class C10dComm final : public Comm {
 public:
  C10dComm(const DistEnv& env, const CommOptions& options) : env_(env), timeout_(options.timeout) {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    so.isServer = !env.agent_store && env.rank == 0;
    so.numWorkers = env.agent_store ? std::nullopt : std::optional<size_t>(env.world_size);
    so.waitWorkers = false;
    so.timeout = options.timeout;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    } catch (const std::exception& e) {
      throw CommError(fmt::format("rendezvous with the store at {}:{} ({}) failed: {}", env.master_addr,
                                  env.master_port, so.isServer ? "hosting it" : "as a client", e.what()));
    }
    const std::string prefix = fmt::format("kiln/{}/", env.restart_count);
    try {
      auto ctl_opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
      ctl_opts->devices.push_back(gloo_device(env));
      ctl_opts->threads = 1;
      control_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(prefix + "control", store_), env.rank, env.world_size, ctl_opts);
      if (options.cuda_device >= 0) {
#ifdef KILN_WITH_NCCL
        const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(options.cuda_device));
        auto nccl_opts = c10d::ProcessGroupNCCL::Options::create();
        nccl_opts->timeout = options.timeout;
        auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
            c10::make_intrusive<c10d::PrefixStore>(prefix + "data", store_), env.rank, env.world_size, nccl_opts);
        data_ = nccl;
        backend_ = "nccl";
        // As init_process_group(device_id=...) does: the group is bound to this rank's GPU, so no
        // later call guesses one from the rank, and the communicator is created now (every rank
        // here, at the same point) instead of at the first collective, in the middle of backward.
        nccl->setBoundDeviceId(device);
        nccl->eagerConnectSingleDevice(device);
#else
        throw CommError("this kiln was built without NCCL (KILN_WITH_NCCL): cannot train data-parallel on CUDA");
#endif
      } else {
        auto data_opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
        data_opts->devices.push_back(gloo_device(env));
        data_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
            c10::make_intrusive<c10d::PrefixStore>(prefix + "data", store_), env.rank, env.world_size, data_opts);
        backend_ = "gloo";
      }
    } catch (const std::exception& e) {
      teardown(/*abort=*/true);  // what was joined goes in order; the others fail at once, not at the timeout
      if (dynamic_cast<const CommError*>(&e)) throw;
      throw CommError(fmt::format("joining the process group (rank {} of {}, store {}:{}) failed: {}", env.rank,
                                  env.world_size, env.master_addr, env.master_port, e.what()));
    }
  }

  ~C10dComm() override {
    try {
      teardown(/*abort=*/std::uncaught_exceptions() > 0 || failed_->load());
    } catch (...) {  // a destructor cannot report: shutdown() and abort() are the calls that do
    }
  }

  int rank() const override {
    return env_.rank;
  }
  int world_size() const override {
    return env_.world_size;
  }
  const DistEnv& env() const override {
    return env_;
  }
  std::string backend() const override {
    return backend_;
  }

  std::unique_ptr<Pending> all_reduce_sum(at::Tensor t) override {
    std::vector<at::Tensor> ts{std::move(t)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = timeout_;
    return run("all_reduce", [&] { return data()->allreduce(ts, o); });
  }

  std::unique_ptr<Pending> all_gather(at::Tensor out, at::Tensor in) override {
    c10d::AllgatherOptions o;
    o.timeout = timeout_;
    return run("all_gather", [&] { return data()->_allgather_base(out, in, o); });
  }

  std::unique_ptr<Pending> reduce_scatter_sum(at::Tensor out, at::Tensor in) override {
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = timeout_;
    return run("reduce_scatter", [&] { return data()->_reduce_scatter_base(out, in, o); });
  }

  void broadcast(std::vector<at::Tensor> tensors, int root) override {
    // Gloo and NCCL take one tensor per call here (several would mean several devices).
    for (at::Tensor& t : tensors) {
      std::vector<at::Tensor> one{t};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.timeout = timeout_;
      run("broadcast", [&] { return data()->broadcast(one, o); })->wait();
    }
  }

  std::vector<double> host_sum(std::vector<double> values) override {
    at::Tensor t = at::tensor(values, at::TensorOptions().dtype(at::kDouble));
    control_reduce(t, c10d::ReduceOp::SUM, "all_reduce (sum of host values)");
    return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
  }

  std::vector<int64_t> host_max(std::vector<int64_t> values) override {
    at::Tensor t = at::tensor(values, at::TensorOptions().dtype(at::kLong));
    control_reduce(t, c10d::ReduceOp::MAX, "all_reduce (max of host values)");
    return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
  }

  void barrier() override {
    c10d::BarrierOptions o;
    o.timeout = timeout_;
    WorkPending(wrap("barrier", [&] { return control("barrier")->barrier(o); }),
                fmt::format("barrier (rank {} of {})", env_.rank, env_.world_size), failed_)
        .wait();
  }

  void shutdown() override {
    teardown(/*abort=*/false);
  }
  void abort() override {
    teardown(/*abort=*/true);
  }

 private:
  // The order of docs/distributed.md, "Shutdown". Each group is released here, so its destructor
  // (Gloo: waits for its queued collectives, joins its threads, closes its connections) runs now, in
  // this order, not whenever the last reference goes.
  void teardown(bool abort) {
    if (closed_) return;
    closed_ = true;
    std::string error;
    if (!abort && data_) {
      try {
        data_->shutdown();  // NCCL: flushes and destroys the communicator; Gloo: nothing to do
      } catch (const std::exception& e) {
        error = fmt::format("shutting down the {} group (rank {} of {}) failed: {}", backend_, env_.rank,
                            env_.world_size, e.what());
        abort = true;  // what NCCL could not finalize is aborted
      }
    }
    if (abort) {
      if (data_) {
        try {
          data_->abort();                  // NCCL: ncclCommAbort, kernels in flight end; Gloo: nothing (c10d has none)
        } catch (const std::exception&) {  // aborting a broken group: its failure was already reported
        }
      }
      control_.reset();  // never anything in flight: its connections close now, the others fail at once
      data_.reset();     // Gloo: queued collectives fail as the others close theirs
    } else {
      data_.reset();
      control_.reset();
    }
    store_.reset();  // last: the groups' rendezvous keys live in it (rank 0 hosts it without torchrun)
    if (!error.empty()) throw CommError(error);
  }

  c10d::Backend* data() {
    if (!data_)
      throw CommError(fmt::format("the {} group (rank {} of {}) was shut down", backend_, env_.rank, env_.world_size));
    return data_.get();
  }
  c10d::Backend* control(const char* what) {
    if (!control_) {
      throw CommError(
          fmt::format("{} (rank {} of {}): the control group was shut down", what, env_.rank, env_.world_size));
    }
    return control_.get();
  }
  template <typename F>
  c10::intrusive_ptr<c10d::Work> wrap(const char* what, F&& launch) {
    try {
      return launch();
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      failed_->store(true);
      throw CommError(fmt::format("{} failed: {}", what, e.what()));
    }
  }
  template <typename F>
  std::unique_ptr<Pending> run(const char* what, F&& launch) {
    return std::make_unique<WorkPending>(
        wrap(what, std::forward<F>(launch)),
        fmt::format("{} on the {} group (rank {} of {})", what, backend_, env_.rank, env_.world_size), failed_);
  }
  void control_reduce(at::Tensor& t, c10d::ReduceOp op, const char* what) {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    o.timeout = timeout_;
    WorkPending(wrap(what, [&] { return control(what)->allreduce(ts, o); }),
                fmt::format("{} (rank {} of {})", what, env_.rank, env_.world_size), failed_)
        .wait();
  }

  DistEnv env_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> control_, data_;
  std::string backend_ = "gloo";
  FailedFlag failed_ = std::make_shared<std::atomic<bool>>(false);
  bool closed_ = false;
};

}  // namespace

std::shared_ptr<Comm> connect(const DistEnv& env, const CommOptions& options) {
  return std::make_shared<C10dComm>(env, options);
}
#else
std::shared_ptr<Comm> connect(const DistEnv& env, const CommOptions& /*options*/) {
  throw CommError(fmt::format(
      "launched as rank {} of {} ({}), but this kiln was built without data parallelism: gloo's headers were "
      "missing at configure time (Debian: libgloo-dev); install them and rebuild",
      env.rank, env.world_size, env.launcher));
}
#endif

}  // namespace kiln::dist
