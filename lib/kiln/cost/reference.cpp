#include "kiln/cost/reference.h"

#include <algorithm>
#include <stdexcept>

#include "kiln/cost/caching_allocator.h"
#include "kiln/cost/memory.h"

namespace kiln::cost {

std::string reference_sdpa_backend(const HardwareSpec& hardware, const std::string& dtype) {
  if (dtype == "fp32" || hardware.family == "V100") return "memory-efficient";
  return "flash";
}

RunDescription reference_run(const RunDescription& run) {
  RunDescription r = run;
  r.recompute = "full";
  r.every = 1;
  r.kernels = KernelChoices{};  // ATen's ops throughout, SDPA's fused attention
  r.kernels.attention = "sdpa";
  r.clip_grad_norm = true;
  r.cuda = true;
  return r;
}

StepTime step_time(const TrafficReport& report, const Roofline& roof, const HostModel& host, bool eager) {
  const double a = static_cast<double>(report.run.gradient_accumulation_steps);
  if (!(host.seconds_per_op >= 0)) throw std::invalid_argument("step_time: seconds_per_op must be >= 0");
  StepTime s;
  for (const TrafficRow& row : report.rows) {
    const double seconds = roof.seconds(eager ? row.eager : row.kiln) * row.repeats;
    if (row.pass == Pass::kStep) {
      s.device_step += seconds;
    } else {
      s.device_micro_batch += seconds / a;
    }
  }
  const double layers = static_cast<double>(report.model.num_hidden_layers);
  const HostOps& o = host.ops;
  const bool fp16 = report.run.dtype == "fp16";
  const double ops_mb = o.forward_fixed + o.forward_per_layer * layers + o.backward_fixed +
                        o.backward_per_layer * layers + (fp16 ? o.scaler_per_micro_batch : 0.0);
  const double ops_step = o.step + (fp16 ? o.scaler_per_step : 0.0);
  s.ops_per_step = a * ops_mb + ops_step;
  const double launch_mb = ops_mb * host.seconds_per_op, launch_step = ops_step * host.seconds_per_op;
  s.host_micro_batch = launch_mb + host.fixed_per_micro_batch;
  s.host_step = launch_step + host.fixed_per_step;
  if (host.sync_per_micro_batch) {
    // After each synchronisation the device idles through the trainer's own host work, then runs
    // as the host issues: the larger of the issuing and the device's work.
    s.seconds = a * (host.fixed_per_micro_batch + std::max(launch_mb, s.device_micro_batch)) + host.fixed_per_step +
                std::max(launch_step, s.device_step);
    s.host_bound = launch_mb > s.device_micro_batch;
  } else {
    const double all_host = a * s.host_micro_batch + s.host_step;
    const double all_device = a * s.device_micro_batch + s.device_step;
    s.seconds = std::max(all_host, all_device);
    s.host_bound = all_host > all_device;
  }
  return s;
}

namespace {

// The reference step's tensors through the caching allocator's model (see reference_memory).
class Replay {
 public:
  Replay(const model::LlamaConfig& m, const RunDescription& run) : m_(m), run_(run) {
    n_ = static_cast<double>(run.batch * run.cutoff_len);
    h_ = static_cast<double>(m.hidden_size), f_ = static_cast<double>(m.intermediate_size);
    v_ = static_cast<double>(m.vocab_size);
    q_ = static_cast<double>(m.num_attention_heads * m.resolved_head_dim());
    kv_ = static_cast<double>(m.kv_heads() * m.resolved_head_dim());
    heads_ = static_cast<double>(m.num_attention_heads);
    autocast_ = run.dtype != "fp32";
    c_ = compute_dtype_bytes(run.dtype);
    // Parameter tensors in the module's order: the embedding, per layer its projections and norms,
    // the final norm, an untied head.
    params_.push_back(v_ * h_);
    for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
      for (double e : {q_ * h_, kv_ * h_, kv_ * h_, h_ * q_, f_ * h_, f_ * h_, h_ * f_, h_, h_}) params_.push_back(e);
    }
    params_.push_back(h_);
    if (!m.tie_word_embeddings) params_.push_back(v_ * h_);
    head_param_ = m.tie_word_embeddings ? 0 : params_.size() - 1;
  }

  void run(int steps) {
    // LLaMA-Factory's load: the weights in the compute dtype, each trainable one upcast to fp32.
    for (double e : params_) {
      const int64_t low = autocast_ ? alloc(c_ * e) : 0;
      weights_.push_back(alloc(4 * e));
      if (low) release(low);
    }
    grads_.assign(params_.size(), 0);
    for (int s = 0; s < steps; ++s) {
      for (int64_t mb = 0; mb < run_.gradient_accumulation_steps; ++mb) micro_batch();
      optimizer_step();
    }
  }

  const CachingAllocatorModel& allocator() const { return a_; }
  const std::string& growth_phase() const { return growth_phase_; }

 private:
  int64_t alloc(double bytes) {
    const double before = a_.reserved();
    const int64_t handle = a_.allocate(bytes);
    if (a_.reserved() > before) growth_phase_ = phase_;
    return handle;
  }
  void release(int64_t handle) {
    if (handle) a_.free(handle);
  }
  void release(std::vector<int64_t>& handles) {
    for (int64_t h : handles) release(h);
    handles.clear();
  }
  // A parameter's gradient: the matmul's, cast to fp32 under autocast, stolen into .grad or added
  // into it in place.
  void gradient(size_t param) {
    const double e = params_[param];
    const int64_t low = autocast_ ? alloc(c_ * e) : 0;
    const int64_t g = alloc(4 * e);
    release(low);
    if (grads_[param]) {
      release(g);
    } else {
      grads_[param] = g;
    }
  }
  std::vector<double> layer_matmul_weights() const {
    return {q_ * h_, kv_ * h_, kv_ * h_, h_ * q_, f_ * h_, f_ * h_, h_ * f_};
  }

  void micro_batch() {
    const double n = n_, h = h_, c = c_;
    phase_ = "forward";
    std::vector<int64_t> inputs{alloc(4 * n * h)};  // the embedding's output: layer 0's saved input
    std::vector<int64_t> casts;                     // autocast's cache, until the forward ends
    for (int64_t l = 0; l < m_.num_hidden_layers; ++l) {
      if (autocast_) {
        for (double e : layer_matmul_weights()) casts.push_back(alloc(c * e));
      }
      // Under no_grad the layer's intermediates live briefly: the MLP's, the largest.
      std::vector<int64_t> t{alloc(4 * n * h), alloc(c * n * h), alloc(c * n * f_), alloc(c * n * f_),
                             alloc(c * n * f_)};
      release(t);
      inputs.push_back(alloc(4 * n * h));  // its output, the next layer's saved input
    }
    // The final norm (with grad: it saves its normalised values and rsqrt), the head's input cast
    // and weight cast (saved by the head's matmul), then the loss chain.
    std::vector<int64_t> norm{alloc(4 * n * h), alloc(4 * n)};
    const int64_t out = alloc(4 * n * h);
    int64_t head_input = 0;
    if (autocast_) {
      head_input = alloc(c * n * h);
      release(out);
    }
    const int64_t head_weight = autocast_ ? alloc(c * v_ * h) : 0;
    phase_ = "loss (forward)";
    const double nv = n * v_;
    int64_t logits = alloc(c * nv);
    if (autocast_) {
      const int64_t upcast = alloc(4 * nv);
      release(logits);
      logits = upcast;
    }
    const int64_t shifted = alloc(4 * nv), log_probs = alloc(4 * nv);
    release(shifted);
    release(casts);   // autocast exits: the layers' weight copies go (nothing saved them)
    release(logits);  // the output (and its fp32 logits) is dropped before backward
    phase_ = "loss (backward)";
    const int64_t g_nll = alloc(4 * nv), g_lsm = alloc(4 * nv);
    release(log_probs);
    release(g_nll);
    const int64_t g_full = alloc(4 * nv);  // the slice's backward: zeros of the full shape
    release(g_lsm);
    int64_t g_logits = g_full;
    if (autocast_) {
      g_logits = alloc(c * nv);
      release(g_full);
    }
    const int64_t dx_head = alloc(c * n * h);
    phase_ = "backward";
    gradient(head_param_);  // the head's weight (tied: the embedding's .grad)
    release(g_logits);
    release(head_weight);
    release(head_input);
    int64_t dx = alloc(4 * n * h);  // the final norm's input gradient
    release(dx_head);
    release(norm);
    if (!autocast_) release(out);
    for (int64_t l = m_.num_hidden_layers - 1; l >= 0; --l) {
      // Recomputed: the weights' casts and the layer's saved tensors (cost/memory.h's per-layer
      // terms as transformers 4.45 keeps them: K and V repeated to every head for SDPA).
      std::vector<int64_t> lc, acts;
      if (autocast_) {
        for (double e : layer_matmul_weights()) lc.push_back(alloc(c * e));
      }
      for (double e : {4 * n * h,
                       4 * n,
                       autocast_ ? c * n * h : 4 * n * h,
                       autocast_ ? c * n * h : 0.0,
                       autocast_ ? c * n * h : 0.0,
                       c * n * q_,
                       c * n * q_,
                       c * n * q_,
                       c * n * q_,
                       4 * n * heads_,
                       c * n * q_,
                       4 * n * h,
                       4 * n * h,
                       4 * n,
                       autocast_ ? c * n * h : 4 * n * h,
                       autocast_ ? c * n * h : 0.0,
                       c * n * f_,
                       c * n * f_,
                       c * n * f_,
                       c * n * f_,
                       4 * n * h}) {
        if (e > 0) acts.push_back(alloc(e));
      }
      const size_t first = 1 + 9 * static_cast<size_t>(l);
      for (size_t p = first + 8; p + 1 > first; --p) gradient(p);
      const int64_t dx_in = alloc(4 * n * h);
      release(dx);
      dx = dx_in;
      release(acts);
      release(lc);
      release(inputs[static_cast<size_t>(l) + 1]);
    }
    gradient(0);  // the embedding lookup's dense gradient
    release(dx);
    release(inputs[0]);
    gradient(params_.size() - 1 - (m_.tie_word_embeddings ? 0 : 1));  // the final norm's weight
  }

  void optimizer_step() {
    phase_ = "optimizer step";
    if (moments_.empty()) {
      for (double e : params_) moments_.push_back(alloc(4 * e)), moments_.push_back(alloc(4 * e));
    }
    std::vector<int64_t> sqrt_tmp;
    for (double e : params_) sqrt_tmp.push_back(alloc(4 * e));
    release(sqrt_tmp);
    for (int64_t& g : grads_) {
      release(g);
      g = 0;
    }
  }

  const model::LlamaConfig& m_;
  const RunDescription& run_;
  double n_ = 0, h_ = 0, f_ = 0, v_ = 0, q_ = 0, kv_ = 0, heads_ = 0, c_ = 4;
  bool autocast_ = false;
  std::vector<double> params_;
  size_t head_param_ = 0;
  std::vector<int64_t> weights_, grads_, moments_;
  CachingAllocatorModel a_;
  std::string phase_ = "load", growth_phase_;
};

}  // namespace

SmiMemory reference_memory(const model::LlamaConfig& m, const RunDescription& run) {
  run.validate();
  const double p = static_cast<double>(m.num_parameters());
  const double n = static_cast<double>(run.batch * run.cutoff_len);
  const double h = static_cast<double>(m.hidden_size), v = static_cast<double>(m.vocab_size);
  const double layers = static_cast<double>(m.num_hidden_layers);
  const bool autocast = run.dtype != "fp32";
  const double c = compute_dtype_bytes(run.dtype);
  const double norms = h * (2.0 * layers + 1.0);
  const double matmul_weights = p - norms - (m.tie_word_embeddings ? 0.0 : v * h);
  const std::vector<std::pair<std::string, double>> boundary = {
      {"parameters + AdamW moments (fp32)", 12.0 * p},
      {"autocast weight copies", autocast ? c * matmul_weights : 0.0},
      {"checkpointed layer inputs (fp32)", 4.0 * n * h * (layers + 1.0)},
      {"logits, shifted copy, log_softmax (fp32)", 12.0 * n * v}};
  const std::vector<std::pair<std::string, double>> optimizer = {{"parameters + AdamW moments (fp32)", 12.0 * p},
                                                                 {"gradients (fp32)", 4.0 * p},
                                                                 {"foreach AdamW sqrt(exp_avg_sq)", 4.0 * p}};
  auto sum = [](const auto& parts) {
    double t = 0;
    for (const auto& part : parts) t += part.second;
    return t;
  };
  Replay replay(m, run);
  replay.run(3);  // steady by the third step: the same segments at ten
  SmiMemory out;
  out.components = sum(boundary) >= sum(optimizer) ? boundary : optimizer;
  out.allocated = replay.allocator().peak_allocated();
  out.reserved = replay.allocator().reserved();
  out.peak_phase = replay.growth_phase();
  return out;
}

SmiMemory kiln_memory(const model::LlamaConfig& config, const RunDescription& run) {
  RunDescription r = run;
  r.cuda = true;
  const MemoryEstimate e = estimate_training_memory(config, r);
  SmiMemory out;
  out.components = e.components;
  out.peak_phase = e.peak_phase;
  out.allocated = e.total();
  out.reserved = e.total() + e.allocator_overhead;
  return out;
}

}  // namespace kiln::cost
