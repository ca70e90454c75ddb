#include "kiln/ops/attention.h"

#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include "kiln/common/logger.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/flash_attention.h"

namespace kiln::ops {

namespace {

// Logs which implementation ops::attention picked, once per distinct choice (path, dtype,
// head_dim, heads, device), so a run's log says what its attention ran on without a line per
// call. Called per layer per step: the key is a tuple, the message is formatted only when new.
enum class Choice { kKernel, kNotApplicable, kNotChosen };
void log_choice(Choice choice, const at::Tensor& q, const at::Tensor& k) {
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int>;
  static std::mutex mutex;
  static std::set<Key> logged;
  const Key key{static_cast<int>(choice), static_cast<int>(q.scalar_type()), q.size(3), q.size(1), k.size(1),
                q.device().index()};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!logged.insert(key).second) return;
  }
  const std::string what = fmt::format("{}, head_dim {}, {} query / {} KV heads, {}", c10::toString(q.scalar_type()),
                                       q.size(3), q.size(1), k.size(1), q.device().str());
  if (choice == Choice::kKernel) {
    kiln::logger()->info("kiln attention: kiln flash-attention kernels ({})", what);
  } else if (choice == Choice::kNotChosen) {
    kiln::logger()->info(
        "kiln attention: ATen SDPA, the default; kiln's flash-attention kernels are opt-in (kernels: "
        "kiln,attention=kiln) ({})",
        what);
  } else {
    kiln::logger()->info(
        "kiln attention: ATen SDPA; kiln's kernels need bf16/fp16, head_dim 64/128 and sm_80+ (sm_70: fp16, "
        "head_dim 64) ({})",
        what);
  }
}

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionOptions& options) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: q, k, v must be [B, H, T, D], got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes(), "attention: k and v shapes differ: ", k.sizes(), " vs ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "attention: batch or head_dim of q ", q.sizes(),
              " and k ", k.sizes(), " differ");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "attention: KV heads (", k.size(1),
              ") must divide query heads (", q.size(1), ")");
  // Under autocast the inputs may differ (fp32 q/k after RoPE, low-precision v, as in HF);
  // SDPA is on autocast's lower-precision list and casts them all to the autocast dtype.
  TORCH_CHECK(at::autocast::is_autocast_enabled(q.device().type()) ||
                  (q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type()),
              "attention: q, k, v dtypes differ: ", q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type());
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), "attention: q, k, v devices differ");
  if (q.is_cuda() && backend(Op::kAttention) == Backend::kKiln) {
    // kiln's flash-attention kernels; under autocast they take the inputs in the autocast dtype,
    // as SDPA (on autocast's lower-precision list) would.
    at::Tensor qk = q, kk = k, vk = v;
    if (at::autocast::is_autocast_enabled(at::kCUDA)) {
      const at::ScalarType dt = at::autocast::get_autocast_dtype(at::kCUDA);
      qk = q.to(dt), kk = k.to(dt), vk = v.to(dt);
    }
    const FlashAttentionParams fp{
        .scale = options.scale.value_or(0.0), .causal = options.causal, .segment_ids = options.segment_ids};
    if (flash_attention_kernel_applies(qk, kk, vk, fp)) {
      log_choice(Choice::kKernel, qk, kk);
      return flash_attention(qk, kk, vk, fp);
    }
    log_choice(Choice::kNotApplicable, qk, kk);
  } else if (q.is_cuda()) {
    log_choice(Choice::kNotChosen, q, k);
  }
  const bool gqa = q.size(1) != k.size(1);
  const int64_t t = q.size(2), s = k.size(2);
  if (options.segment_ids.defined()) {
    // Document-boundary masking: a query sees only keys of its own segment (and the past).
    const at::Tensor& seg = options.segment_ids;
    TORCH_CHECK(seg.dim() == 2 && seg.size(0) == q.size(0) && seg.size(1) == t && t == s,
                "attention: segment_ids must be [B, T] with as many keys as queries, got ", seg.sizes());
    at::Tensor mask = (seg.unsqueeze(2) == seg.unsqueeze(1)).unsqueeze(1).to(q.device());  // [B, 1, T, T]
    if (options.causal) mask = mask.logical_and(at::ones({t, s}, mask.options()).tril());
    return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false, options.scale, gqa);
  }
  if (options.causal && t != s) {
    // SDPA's is_causal aligns the first query with the first key; with a KV cache the queries are
    // the last t positions, so the mask must be aligned bottom-right: query i sees keys <= s - t + i.
    TORCH_CHECK(t <= s, "attention: causal with more queries (", t, ") than keys (", s, ")");
    const at::Tensor mask = at::ones({t, s}, q.options().dtype(at::kBool)).tril(s - t);
    return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false, options.scale, gqa);
  }
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, options.causal, options.scale,
                                          /*enable_gqa=*/gqa);
}

}  // namespace kiln::ops
