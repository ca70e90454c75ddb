// RoPE against its closed form, computed here in fp64 with plain loops:
//   theta_i = base^(-2i/D) (then Llama 3's piecewise scaling, written from Meta's reference
//   `apply_scaling`), and the rotation of each pair (x_i, x_{i+D/2}) by the angle p * theta_i.
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/model/rope.h"
#include "kiln/ops/rope.h"
#include "support.h"

using kiln::model::LlamaConfig;

namespace {

std::vector<double> closed_form_inv_freq(const LlamaConfig& c) {
  const int64_t d = c.resolved_head_dim();
  std::vector<double> out;
  for (int64_t i = 0; i < d / 2; ++i) {
    double f = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    if (c.rope_scaling.rope_type == "llama3") {
      const auto& s = c.rope_scaling;
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double wavelen = 2 * M_PI / f;
      if (wavelen < old_len / s.high_freq_factor) {
        // high frequency: unchanged
      } else if (wavelen > old_len / s.low_freq_factor) {
        f = f / s.factor;
      } else {
        const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    out.push_back(f);
  }
  return out;
}

void check_inv_freq(const LlamaConfig& c) {
  const at::Tensor got = kiln::model::rope_inv_freq(c);
  const auto want = closed_form_inv_freq(c);
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(got[static_cast<int64_t>(i)].item<double>() == Approx(want[i]).epsilon(2e-6));
  }
}

}  // namespace

TEST_CASE("RoPE inverse frequencies match the closed form", "[rope]") {
  LlamaConfig c;
  c.hidden_size = 2048;
  c.num_attention_heads = 32;
  c.rope_theta = 10000;
  check_inv_freq(c);
  // Llama 3.2 scaling; 64 frequencies span all three bands (kept, blended, divided by 32).
  c = kiln::model::load_llama_config("llama-3.2-1b");
  check_inv_freq(c);
  const at::Tensor scaled = kiln::model::rope_inv_freq(c);
  c.rope_scaling.rope_type = "default";
  const at::Tensor plain = kiln::model::rope_inv_freq(c);
  const at::Tensor ratio = plain / scaled;
  CHECK(ratio[0].item<double>() == Approx(1.0));                       // highest frequency untouched
  CHECK(ratio[31].item<double>() == Approx(32.0));                     // lowest frequency slowed by `factor`
  CHECK(((ratio > 1.01) & (ratio < 31.9)).sum().item<int64_t>() > 0);  // a blended band exists
}

TEST_CASE("apply_rope rotates each (i, i + D/2) pair by position * theta_i", "[rope]") {
  LlamaConfig c;
  c.hidden_size = 32;
  c.num_attention_heads = 2;  // D = 16
  c.rope_theta = 100;
  const int64_t B = 2, H = 2, T = 7, D = 16;
  const at::Tensor inv_freq = kiln::model::rope_inv_freq(c);
  const at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0).repeat({B, 1}) + at::tensor({0L, 3L}).unsqueeze(1);
  const auto tables = kiln::model::rope_cos_sin(inv_freq, pos, at::kFloat);
  const at::Tensor x = at::randn({B, H, T, D}, at::kFloat);
  const at::Tensor y = kiln::ops::apply_rope(x, tables.cos, tables.sin);
  const auto theta = closed_form_inv_freq(c);
  double worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double angle = static_cast<double>(pos[b][t].item<int64_t>()) * theta[static_cast<size_t>(i)];
          const double x0 = x[b][h][t][i].item<double>(), x1 = x[b][h][t][i + D / 2].item<double>();
          const double y0 = x0 * std::cos(angle) - x1 * std::sin(angle);
          const double y1 = x1 * std::cos(angle) + x0 * std::sin(angle);
          worst = std::max({worst, std::abs(y[b][h][t][i].item<double>() - y0),
                            std::abs(y[b][h][t][i + D / 2].item<double>() - y1)});
        }
  CHECK(worst < 1e-5);
}

TEST_CASE("RoPE scores depend only on relative position", "[rope]") {
  LlamaConfig c = kiln::model::load_llama_config("llama-3.2-1b");
  const int64_t D = c.resolved_head_dim();
  const at::Tensor inv_freq = kiln::model::rope_inv_freq(c).to(at::kDouble);
  const at::Tensor q = at::randn({1, 1, 1, D}, at::kDouble), k = at::randn({1, 1, 1, D}, at::kDouble);
  auto score = [&](int64_t pq, int64_t pk) {
    const auto tq = kiln::model::rope_cos_sin(inv_freq, at::tensor({pq}).view({1, 1}), at::kDouble);
    const auto tk = kiln::model::rope_cos_sin(inv_freq, at::tensor({pk}).view({1, 1}), at::kDouble);
    return (kiln::ops::apply_rope(q, tq.cos, tq.sin) * kiln::ops::apply_rope(k, tk.cos, tk.sin)).sum().item<double>();
  };
  CHECK(score(10, 3) == Approx(score(1010, 1003)).epsilon(1e-4));
  CHECK(score(5, 5) == Approx((q * k).sum().item<double>()).epsilon(1e-4));
}
