#include "kiln/cost/memory.h"

#include <algorithm>
#include <cmath>

#include <stdexcept>

namespace kiln::cost {

double MemoryEstimate::total() const {
  double t = 0;
  for (const auto& [name, bytes] : components) t += bytes;
  return t;
}

double MemoryEstimate::component(const std::string& name) const {
  for (const auto& [n, bytes] : components) {
    if (n == name) return bytes;
  }
  return 0;
}

MemoryEstimate estimate_training_memory(const model::LlamaConfig& c, const RunDescription& o) {
  o.validate();
  const int64_t batch = o.batch, cutoff_len = o.cutoff_len;
  const double n = static_cast<double>(c.num_parameters());
  const double tokens = static_cast<double>(batch * cutoff_len);
  const double layers = static_cast<double>(c.num_hidden_layers), h = static_cast<double>(c.hidden_size);
  const double ffn = static_cast<double>(c.intermediate_size), vocab = static_cast<double>(c.vocab_size);
  const double q = static_cast<double>(c.num_attention_heads * c.resolved_head_dim());
  const double kv = static_cast<double>(c.kv_heads() * c.resolved_head_dim());
  const double cb = o.compute_bytes();
  const bool autocast = o.compute_bytes() < 4;

  // Which ops run kiln's fused implementations: they save other tensors than the ATen
  // composition autograd differentiates (RoPE works in place either way: no term).
  const KernelChoices& k = o.kernels;
  const bool fused_norm = k.fused_rmsnorm, fused_swiglu = k.fused_swiglu;
  const bool fused_head = k.fused_loss_head;
  const bool head_low_precision = autocast && k.loss_head_low_precision;

  // The decoder's projections on a CPU without AMX run as fp32 GEMMs from the fp32 master weights
  // (ops::linear), which keep no low-precision copy; only a head through at::linear still makes one.
  const bool projections_fp32 = autocast && !o.cuda && k.projections_fp32;
  // The projections' inputs as their matmuls save them, per token: each norm's output once (2H)
  // where the projections take it as it is (fp32 throughout, or ops::linear's fp32 GEMMs); under
  // autocast with the projections through at::linear (a GPU, or a CPU with AMX), autocast casts
  // the activation anew for each of q, k, v, gate and up (it caches only the weights' casts), and
  // each matmul saves its own cast: 5H. (Measured on an AMX CPU, tiny bf16 at cutoff_len 1024:
  // with 2H the model was 17% under the counted peak.)
  const double projection_inputs = autocast && !projections_fp32 ? 5.0 : 2.0;

  // Saved for backward per token (see the header and docs/performance.md).
  double per_layer = (fused_norm ? 6.0 : 16.0) * h +
                     cb * (projection_inputs * h + 3.0 * q + 2.0 * kv + (fused_swiglu ? 3.0 : 4.0) * ffn);
  // Selective recomputation: the norms' outputs, their casts and the SwiGLU product are rebuilt in
  // backward (fused with the matmuls that consume them), the merged attention output is not
  // copied; kept are the two fp32 residuals (the norms' inputs), q/k/v and the attention output
  // (the attention's own saved tensors) and gate/up, with either backend. Backward of the top
  // layer then holds one F-sized tensor more than without recomputation (measured): there the
  // SwiGLU product, saved and counted at the boundary, is freed before gate's and up's gradients
  // are formed; recomputed, it has nothing to give back.
  double selective_layer = 8.0 * h + cb * (2.0 * q + 2.0 * kv + 2.0 * ffn);
  if (o.kernels.attention == "math") {
    // Softmax probabilities [heads, T, T] per sequence: T * heads * c per token.
    per_layer += static_cast<double>(cutoff_len) * static_cast<double>(c.num_attention_heads) * cb;
    selective_layer += static_cast<double>(cutoff_len) * static_cast<double>(c.num_attention_heads) * cb;
  }
  // Recomputed layers keep their fp32 input (4H per token); one of them is rebuilt at a time.
  // Backward runs from the last layer down: rebuilding a layer adds one layer's activations on top
  // of what the layers below it still hold, which passes the forward/backward boundary's total
  // only when the last layer itself is recomputed (always for full; for every_n when
  // (L - 1) % n == 0); otherwise the kept layers above it were freed first.
  const int every = std::max(o.recomputed_stride(), 1);
  const bool selective = o.recompute == "selective";
  const double recomputed = o.recomputed_stride() > 0 ? std::ceil(layers / static_cast<double>(every)) : 0.0;
  const bool top_recomputed = recomputed > 0 && (c.num_hidden_layers - 1) % every == 0;
  const double activations =
      selective
          ? tokens * (layers * selective_layer + cb * ffn)
          : tokens * (recomputed * 4.0 * h + (layers - recomputed) * per_layer + (top_recomputed ? per_layer : 0.0));
  double head = tokens * ((8.0 + cb) * h + (autocast ? 16.0 : 10.0) * vocab);
  if (fused_head) {
    // Chunked linear + cross-entropy: the forward computes both gradients and saves them. The
    // final norm's part as above, grad_hidden (cb per element), the fp32 weight-gradient
    // accumulator (plus its compute-dtype copy under autocast), and one chunk's logits with
    // their fp32 softmax/gradient.
    // On a CPU without AMX the head runs in fp32 (the ops rule in train/kernel_choices.cpp): fp32
    // copies of the hidden states and of their gradient, no low-precision weight or gradient.
    if (!k.loss_chunk_tokens) throw std::invalid_argument("KernelChoices: a fused loss head needs loss_chunk_tokens");
    const double chunk = static_cast<double>(k.loss_chunk_tokens(batch * cutoff_len, c.vocab_size, c.hidden_size));
    const double hb = head_low_precision ? cb : 4.0;
    // The chunk: its logits, plus ATen's fp32 log-probabilities unless the fused CPU loop writes
    // the gradient over the logits in place (KernelChoices::cpu_loss_loop): fp32 logits, or
    // bf16 ones (compute_bytes 2 is taken as bf16, as the head rule above takes it), whose chunks'
    // weight gradients then pass through one reused bf16 [V, H] buffer instead of a bf16 product
    // and an fp32 copy of it per chunk.
    // On a GPU the chunk's softmax is kiln's kernel (kernels/cross_entropy.cu, every
    // architecture kiln builds for), which writes the gradient over the logits in place too: the
    // chunk is its logits alone, one chunk at a time (each is freed before the next is allocated).
    const bool cpu_loop = !o.cuda && !head_low_precision && k.cpu_loss_loop;
    const bool cpu_loop_low = !o.cuda && head_low_precision && k.cpu_loss_loop_low_precision;
    const bool in_place = o.cuda || cpu_loop || cpu_loop_low;
    head = tokens * (8.0 + 2.0 * hb) * h +
           (head_low_precision ? 4.0 + cb + (cpu_loop_low ? cb : 0.0) : 4.0) * vocab * h +
           chunk * vocab *
               (in_place             ? hb
                : head_low_precision ? cb + 8.0
                                     : 8.0);
  }
  // Autocast caches a low-precision copy of every matmul weight for the step's forward; backward
  // keeps using it. Matmul weights: all but the input embedding (unless tied to the head) and norms.
  const double embed = vocab * h;
  const double norms = h * (2.0 * layers + 1.0);
  // (The fused head's low-precision weight copy is its own, counted in `head` above; an fp32 head
  // makes none.)
  const double matmul_weights = n - norms - (c.tie_word_embeddings ? 0.0 : embed) -
                                (fused_head && autocast && !head_low_precision ? vocab * h : 0.0);
  const double projection_weights = n - norms - vocab * h * (c.tie_word_embeddings ? 1.0 : 2.0);
  const double weight_copies = autocast ? cb * (matmul_weights - (projections_fp32 ? projection_weights : 0.0)) : 0.0;
  // A tied embedding's gradient arrives twice (LM head, embedding lookup); the sum needs one
  // (autocast, or the fused head's ready-made gradient) or two (fp32 matmul backward) extra fp32
  // copies at the end of backward, as measured.
  const double tied_extra = c.tie_word_embeddings ? (autocast || fused_head ? 1.0 : 2.0) * 4.0 * embed : 0.0;

  const double forward_side = weight_copies + activations + head;
  double backward_end = 4.0 * n + tied_extra;
  MemoryEstimate e;
  double optimizer = 8.0 * n, persistent_grads = 0.0;
  const Parallelism& dp = o.parallel;
  if (dp.data_parallel) {
    const double world = std::max(dp.world_size, 1);
    if (dp.zero_stage >= 1) optimizer /= world;
    if (dp.zero_stage == 2) {
      // The shard lives throughout; at the end of backward also the staged buckets in flight, the
      // one filling (a bucket closes past the cap, so it can hold the largest parameter beyond
      // it), and that parameter's gradient before it is copied in.
      persistent_grads = 4.0 * n / world;
      const double largest = 4.0 * std::max(embed, h * std::max(ffn, q));
      backward_end = static_cast<double>(dp.max_in_flight + 1) * static_cast<double>(dp.bucket_cap_bytes) +
                     2.0 * largest + tied_extra;
    } else {
      persistent_grads = 4.0 * n;  // the flat gradient buffer, allocated once
      backward_end = tied_extra;
    }
  }
  e.components = {{"parameters (fp32)", 4.0 * n}, {"optimizer (AdamW, fp32)", optimizer}};
  if (dp.data_parallel) e.components.emplace_back("gradient buffer (data parallel)", persistent_grads);
  if (forward_side >= backward_end) {
    e.peak_phase = "forward/backward boundary";
    e.components.emplace_back("gradients (fp32)", 0.0);
    e.components.emplace_back("autocast weight copies", weight_copies);
    e.components.emplace_back("activations", activations);
    e.components.emplace_back("logits and loss", head);
  } else {
    e.peak_phase = "end of backward";
    e.components.emplace_back("gradients (fp32)", backward_end);
    e.components.emplace_back("autocast weight copies", 0.0);
    e.components.emplace_back("activations", 0.0);
    e.components.emplace_back("logits and loss", 0.0);
  }
  if (o.cuda) e.allocator_overhead = 0.05 * e.total() + 64.0 * 1024 * 1024;
  return e;
}

}  // namespace kiln::cost
