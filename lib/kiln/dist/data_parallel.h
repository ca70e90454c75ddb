// Data parallelism over a Comm: gradient synchronisation that overlaps backward, and ZeRO
// stages 1 and 2 (docs/distributed.md). The model stays single-device; this object is applied
// to its parameters from outside (torchtitan's rule).
//
// Layout. Parameters are taken in reverse registration order (the order backward produces
// their gradients) and grouped into buckets of about `bucket_cap_bytes`; each bucket is a
// contiguous range of one flat fp32 buffer, padded to a multiple of the world size, and every
// parameter's storage becomes a view of that buffer (as FSDP's flat parameters). Rank r owns
// chunk r of every bucket: its optimizer state (stages 1, 2) and its reduced gradients (stage 2).
//
// Synchronisation. A post-accumulate-grad hook on every parameter counts the bucket's gradients
// in; when a bucket is complete its collective is launched asynchronously while backward goes on.
// Buckets are launched strictly in bucket order (as c10d's Reducer does), so every rank issues the
// same collectives in the same order whatever order its autograd engine finishes them in.
//   stage 0, 1  gradients are views of a flat gradient buffer (no copies); only the backward of a
//               step's last micro-batch reduces (all_reduce, sum); stage 1 then updates only the
//               owned chunks and all-gathers the parameters.
//   stage 2     each parameter's gradient is copied into its bucket's staging buffer and freed;
//               the bucket is reduce-scattered (sum) into the owner's shard of the gradients, on
//               every micro-batch (as DeepSpeed's stage 2), so no rank ever holds all gradients.
// The loss is normalised by the target tokens of the whole step summed over ranks (train/gradient_accumulation.h),
// so the summed gradient is exactly the one-process gradient of the same examples.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kiln/dist/comm.h"
#include "kiln/optim/adamw.h"

namespace kiln::dist {

struct DataParallelOptions {
  int64_t bucket_cap_bytes = 25ll << 20;  // HF's ddp_bucket_cap_mb (25)
  int zero_stage = 0;                     // 0, 1 or 2
  bool overlap = true;                    // false: launch every bucket after backward (for measuring the overlap)
  // Stage 2: staged buckets in flight before backward waits for the oldest; stages 1, 2: all-gathers
  // in flight after the optimizer step (each holds a copy of one bucket's chunk).
  int max_in_flight = 2;
};

// Where one parameter lives in the flat layout.
struct FlatParam {
  std::string name;
  at::Tensor param;
  int64_t bucket = 0;
  int64_t offset = 0;  // elements, within the flat buffer
  int64_t numel = 0;
};

struct Bucket {
  int64_t offset = 0;  // elements, within the flat buffer
  int64_t numel = 0;   // padded to a multiple of the world size
  int64_t chunk() const;
  std::vector<int64_t> params;  // indices into DataParallel::params()
  int world = 1;
};

// Communication time of the last step, for the logs and kiln-profile.
struct CommStats {
  double exposed_seconds = 0;  // the host waited on collectives (after backward, the all-gather, the norm)
  int64_t bytes = 0;           // payload bytes this rank sent into collectives
  int64_t collectives = 0;
};

// Gradient buckets launched since construction (never reset; for tests and kiln-profile).
// `overlapped`: launched while the same backward still had gradients to produce, i.e. the
// collective ran beside the rest of backward. With overlap every bucket but the one the last
// gradient completes counts; with `overlap = false` none does.
struct LaunchCounts {
  int64_t buckets = 0;
  int64_t overlapped = 0;
};

class DataParallel {
 public:
  DataParallel(std::shared_ptr<Comm> comm, std::vector<std::pair<std::string, at::Tensor>> named_parameters,
               DataParallelOptions options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  Comm& comm() const { return *comm_; }
  int zero_stage() const { return options_.zero_stage; }
  const std::vector<FlatParam>& params() const { return params_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Rank 0's parameter values to every rank (DDP does this at construction, in Python).
  void broadcast_parameters();

  // Around each micro-batch's backward. `last` = the step's last micro-batch: its gradients are
  // final, so stages 0 and 1 reduce them (stage 2 reduces every micro-batch).
  void begin_backward(bool last);
  // Launches the buckets not yet launched (parameters without a gradient count as zero) and
  // waits for every collective of this backward.
  void end_backward();

  // The tensors this rank's AdamW updates, with their gradients: whole parameters (stage 0), or
  // the owned chunks as flat slices named "<param>[begin:end]" (stages 1, 2).
  std::vector<optim::ParamSpec> optimizer_params() const;
  // The gradients this rank holds for its optimizer (all of them for stages 0/1, the shard for 2).
  std::vector<at::Tensor> local_grads() const;
  // Global L2 norm of the gradients (over all ranks for stage 2), clipping them to max_norm as
  // torch.nn.utils.clip_grad_norm_ (max_norm <= 0 only measures). A 0-d fp32 device tensor.
  at::Tensor clip_grad_norm(double max_norm);
  // Element-wise sum over ranks of a small device tensor (loss sums, found-inf flags), in place.
  void all_reduce(at::Tensor t);
  // After the optimizer step: stages 1, 2 all-gather the updated chunks into every rank's parameters.
  void after_step();
  void zero_grad();

  // Bytes held per rank for gradients: the flat gradient buffer (0, 1) or the shard (2).
  int64_t grad_bytes() const;
  // Stats of the step since the last zero_grad().
  const CommStats& stats() const { return stats_; }
  const LaunchCounts& launch_counts() const { return launch_counts_; }

  // Called by the parameters' hooks.
  void on_grad_ready(int64_t param_index);

 private:
  struct InFlight;
  void launch_ready();
  void launch(int64_t bucket);
  void finish(InFlight& f);
  void wait_all();

  std::shared_ptr<Comm> comm_;
  DataParallelOptions options_;
  std::vector<FlatParam> params_;
  std::vector<Bucket> buckets_;
  at::Tensor flat_params_;           // [total] fp32: every parameter is a view of it
  at::Tensor flat_grads_;            // stages 0, 1: [total], every .grad is a view of it
  at::Tensor shard_grads_;           // stage 2: [total / world], chunk r of every bucket, in bucket order
  std::vector<at::Tensor> staging_;  // stage 2: a bucket's gradients until its reduce-scatter
  std::vector<int64_t> missing_;     // per bucket: gradients still to come in this backward
  std::vector<bool> ready_;
  int64_t next_launch_ = 0;
  int64_t grads_to_come_ = 0;  // parameters of this backward whose gradient has not arrived yet
  bool reducing_ = false;
  std::deque<std::unique_ptr<InFlight>> in_flight_;
  CommStats stats_;
  LaunchCounts launch_counts_;
};

}  // namespace kiln::dist
