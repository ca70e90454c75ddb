#include "kiln/dist/data_parallel.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/common/torch_internals.h"
#include "kiln/optim/grad.h"

namespace kiln::dist {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int64_t Bucket::chunk() const {
  return numel / world;
}

struct DataParallel::InFlight {
  int64_t bucket = 0;
  std::unique_ptr<Pending> pending;
  at::Tensor staging, reduced;  // stage 2: kept alive until the collective is done
};

DataParallel::DataParallel(std::shared_ptr<Comm> comm, std::vector<std::pair<std::string, at::Tensor>> named,
                           DataParallelOptions options)
    : comm_(std::move(comm)), options_(options) {
  if (options_.zero_stage < 0 || options_.zero_stage > 2) {
    throw std::invalid_argument(fmt::format("zero_stage must be 0, 1 or 2, got {}", options_.zero_stage));
  }
  if (options_.bucket_cap_bytes <= 0) throw std::invalid_argument("bucket_cap_bytes must be > 0");
  const int world = comm_->world_size();
  // Reverse registration order: the output side of the network gets its gradients first.
  std::reverse(named.begin(), named.end());
  at::TensorOptions opts;
  for (auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    if (p.scalar_type() != at::kFloat || !p.is_contiguous()) {
      throw std::invalid_argument(
          fmt::format("data parallel: parameter '{}' must be contiguous fp32 (master weights)", name));
    }
    if (params_.empty()) {
      opts = p.options();
    } else if (p.device() != opts.device()) {
      throw std::invalid_argument(fmt::format("data parallel: parameter '{}' is on {}, the others on {}", name,
                                              p.device().str(), opts.device().str()));
    }
    params_.push_back({name, p, 0, 0, p.numel()});
  }
  if (params_.empty()) throw std::invalid_argument("data parallel: no trainable parameters");

  // Buckets: close one as soon as it reaches the cap; pad each to a multiple of the world size.
  const int64_t cap_elems = std::max<int64_t>(options_.bucket_cap_bytes / 4, 1);
  int64_t offset = 0;
  Bucket current;
  current.world = world;
  auto close = [&] {
    const int64_t padded = (current.numel + world - 1) / world * world;
    current.numel = padded;
    offset = current.offset + padded;
    buckets_.push_back(current);
    current = Bucket();
    current.world = world;
    current.offset = offset;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    FlatParam& fp = params_[i];
    fp.bucket = static_cast<int64_t>(buckets_.size());
    fp.offset = current.offset + current.numel;
    current.params.push_back(static_cast<int64_t>(i));
    current.numel += fp.numel;
    if (current.numel >= cap_elems) close();
  }
  if (!current.params.empty()) close();
  const int64_t total = offset;

  at::NoGradGuard no_grad;
  flat_params_ = at::zeros({total}, opts);
  for (FlatParam& fp : params_) {
    at::Tensor view = flat_params_.narrow(0, fp.offset, fp.numel).view(fp.param.sizes());
    view.copy_(fp.param);
    fp.param.set_data(view);
  }
  if (options_.zero_stage < 2) {
    flat_grads_ = at::zeros({total}, opts);
    for (FlatParam& fp : params_) {
      fp.param.mutable_grad() = flat_grads_.narrow(0, fp.offset, fp.numel).view(fp.param.sizes());
    }
  } else {
    shard_grads_ = at::zeros({total / world}, opts);
    staging_.resize(buckets_.size());
  }
  missing_.resize(buckets_.size());
  ready_.assign(buckets_.size(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = static_cast<int64_t>(buckets_[b].params.size());
  // Fires once per backward for each parameter, after autograd has summed all of its incoming
  // gradients into .grad (tied or reused weights included).
  for (size_t i = 0; i < params_.size(); ++i) {
    torch_internals::set_post_accumulate_grad_hook(params_[i].param,
                                                   [this, i] { on_grad_ready(static_cast<int64_t>(i)); });
  }
}

DataParallel::~DataParallel() {
  try {
    in_flight_.clear();  // a collective still running is abandoned (its buffers are kept alive by c10d)
  } catch (...) {
  }
  for (FlatParam& fp : params_) torch_internals::clear_post_accumulate_grad_hook(fp.param);
}

void DataParallel::broadcast_parameters() {
  at::NoGradGuard no_grad;
  const auto t0 = Clock::now();
  comm_->broadcast({flat_params_}, 0);
  stats_.exposed_seconds += seconds_since(t0);
}

void DataParallel::begin_backward(bool last) {
  if (reducing_) throw std::logic_error("data parallel: begin_backward twice without end_backward");
  reducing_ = last || options_.zero_stage == 2;
  next_launch_ = 0;
  grads_to_come_ = static_cast<int64_t>(params_.size());
  std::fill(ready_.begin(), ready_.end(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = static_cast<int64_t>(buckets_[b].params.size());
}

void DataParallel::on_grad_ready(int64_t index) {
  if (!reducing_) return;  // an earlier micro-batch of stages 0/1: gradients accumulate in place
  FlatParam& fp = params_[static_cast<size_t>(index)];
  const int64_t b = fp.bucket;
  --grads_to_come_;
  if (options_.zero_stage == 2) {
    at::NoGradGuard no_grad;
    if (!staging_[b].defined()) staging_[b] = at::zeros({buckets_[b].numel}, flat_params_.options());
    at::Tensor& grad = fp.param.mutable_grad();
    staging_[b].narrow(0, fp.offset - buckets_[b].offset, fp.numel).copy_(grad.reshape({-1}));
    grad.reset();  // only the shard is kept: this rank never holds every gradient
  }
  if (--missing_[b] == 0) {
    ready_[b] = true;
    if (options_.overlap) launch_ready();
  }
}

void DataParallel::launch_ready() {
  while (next_launch_ < static_cast<int64_t>(buckets_.size()) && ready_[next_launch_]) launch(next_launch_++);
}

void DataParallel::launch(int64_t b) {
  const Bucket& bucket = buckets_[b];
  auto f = std::make_unique<InFlight>();
  f->bucket = b;
  if (options_.zero_stage < 2) {
    f->pending = comm_->all_reduce_sum(flat_grads_.narrow(0, bucket.offset, bucket.numel));
  } else {
    if (!staging_[b].defined()) staging_[b] = at::zeros({bucket.numel}, flat_params_.options());
    f->staging = std::move(staging_[b]);
    staging_[b] = at::Tensor();
    f->reduced = at::empty({bucket.chunk()}, flat_params_.options());
    f->pending = comm_->reduce_scatter_sum(f->reduced, f->staging);
  }
  stats_.bytes += bucket.numel * 4;
  ++stats_.collectives;
  ++launch_counts_.buckets;
  if (grads_to_come_ > 0) ++launch_counts_.overlapped;
  in_flight_.push_back(std::move(f));
  if (options_.zero_stage == 2 && static_cast<int>(in_flight_.size()) > options_.max_in_flight) {
    finish(*in_flight_.front());
    in_flight_.pop_front();
  }
}

void DataParallel::finish(InFlight& f) {
  const auto t0 = Clock::now();
  f.pending->wait();
  stats_.exposed_seconds += seconds_since(t0);
  if (options_.zero_stage == 2) {
    at::NoGradGuard no_grad;
    const Bucket& bucket = buckets_[f.bucket];
    shard_grads_.narrow(0, bucket.offset / bucket.world, bucket.chunk()).add_(f.reduced);
  }
}

void DataParallel::wait_all() {
  while (!in_flight_.empty()) {
    finish(*in_flight_.front());
    in_flight_.pop_front();
  }
}

void DataParallel::end_backward() {
  if (!reducing_) return;
  // A parameter that got no gradient in this backward contributes zeros, on every rank alike.
  std::fill(ready_.begin(), ready_.end(), true);
  grads_to_come_ = 0;  // what is launched from here on no longer overlaps backward
  launch_ready();
  wait_all();
  reducing_ = false;
}

std::vector<optim::ParamSpec> DataParallel::optimizer_params() const {
  std::vector<optim::ParamSpec> out;
  if (options_.zero_stage == 0) {
    // Registration order, as a one-process AdamW would see them.
    for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
      out.push_back({it->name, it->param, it->param.dim() > 1, it->param.grad()});
    }
    return out;
  }
  const int rank = comm_->rank();
  for (const Bucket& bucket : buckets_) {
    const int64_t lo = bucket.offset + rank * bucket.chunk(), hi = lo + bucket.chunk();
    for (const int64_t i : bucket.params) {
      const FlatParam& fp = params_[static_cast<size_t>(i)];
      const int64_t s = std::max(lo, fp.offset), e = std::min(hi, fp.offset + fp.numel);
      if (s >= e) continue;
      const at::Tensor grad = options_.zero_stage == 1
                                  ? flat_grads_.narrow(0, s, e - s)
                                  : shard_grads_.narrow(0, bucket.offset / bucket.world + (s - lo), e - s);
      out.push_back({fmt::format("{}[{}:{}]", fp.name, s - fp.offset, e - fp.offset), flat_params_.narrow(0, s, e - s),
                     fp.param.dim() > 1, grad});
    }
  }
  return out;
}

std::vector<at::Tensor> DataParallel::local_grads() const {
  if (options_.zero_stage == 2) return {shard_grads_};
  std::vector<at::Tensor> out;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) out.push_back(it->param.grad());
  return out;
}

at::Tensor DataParallel::clip_grad_norm(double max_norm) {
  if (options_.zero_stage < 2) {
    // Every rank holds the same reduced gradients: the norm is the one-process norm.
    std::vector<at::Tensor> params;
    for (auto it = params_.rbegin(); it != params_.rend(); ++it) params.push_back(it->param);
    return optim::clip_grad_norm(params, max_norm);
  }
  at::NoGradGuard no_grad;
  // The shard's sum of squares in fp64: one fp32 reduction over millions of elements drifts by
  // ~1e-5 relative, and every rank must clip by the one-process norm.
  at::Tensor sq = at::linalg_vector_norm(shard_grads_, 2, {}, false, at::kDouble).square().reshape({1});
  all_reduce(sq);
  const at::Tensor total = sq.sqrt().squeeze().to(at::kFloat);
  if (max_norm > 0) shard_grads_.mul_((max_norm / (total + 1e-6)).clamp_max(1.0));
  return total;
}

void DataParallel::all_reduce(at::Tensor t) {
  const auto t0 = Clock::now();
  comm_->all_reduce_sum(std::move(t))->wait();
  stats_.exposed_seconds += seconds_since(t0);
}

void DataParallel::after_step() {
  if (options_.zero_stage == 0) return;
  at::NoGradGuard no_grad;
  const int rank = comm_->rank();
  // The owned chunk goes in as a copy (the output must not alias the input); at most
  // max_in_flight gathers run at once, so the copies never add up to a parameter-sized buffer.
  std::deque<std::pair<std::unique_ptr<Pending>, at::Tensor>> gathers;
  double waited = 0;
  auto finish_oldest = [&] {
    const auto t0 = Clock::now();
    gathers.front().first->wait();
    waited += seconds_since(t0);
    gathers.pop_front();
  };
  for (const Bucket& bucket : buckets_) {
    if (static_cast<int>(gathers.size()) >= options_.max_in_flight) finish_oldest();
    at::Tensor mine = flat_params_.narrow(0, bucket.offset + rank * bucket.chunk(), bucket.chunk()).clone();
    gathers.emplace_back(comm_->all_gather(flat_params_.narrow(0, bucket.offset, bucket.numel), mine), mine);
    stats_.bytes += bucket.chunk() * 4;
    ++stats_.collectives;
  }
  while (!gathers.empty()) finish_oldest();
  stats_.exposed_seconds += waited;
}

void DataParallel::zero_grad() {
  at::NoGradGuard no_grad;
  if (flat_grads_.defined()) flat_grads_.zero_();
  if (shard_grads_.defined()) shard_grads_.zero_();
  stats_ = CommStats();
}

int64_t DataParallel::grad_bytes() const {
  return static_cast<int64_t>((flat_grads_.defined() ? flat_grads_.nbytes() : 0) +
                              (shard_grads_.defined() ? shard_grads_.nbytes() : 0));
}

}  // namespace kiln::dist
