// Analytic FLOPs. References: the user's note "forward 2.4 GFLOPs per token" for Llama-3.2-1B
// (configs/reference/llamafactory_runs.yaml) and an independent route through the parameter count
// (every parameter but the norms is a matmul weight used once per token; the tied embedding is
// used once, as the LM head).
#include <catch2/catch.hpp>

#include "kiln/cost/flops.h"

TEST_CASE("matmul FLOPs per token equal 2 x the matmul parameters", "[profile]") {
  const auto c = kiln::model::load_llama_config("llama-3.2-1b");
  const int64_t norm_params = c.num_hidden_layers * 2 * c.hidden_size + c.hidden_size;
  const auto f = kiln::cost::flops_per_token(c, 1024);
  CHECK(f.matmul_forward == 2.0 * static_cast<double>(c.num_parameters() - norm_params));
  CHECK(f.matmul_forward / 1e9 == Approx(2.47).epsilon(0.01));  // "2.4 GFLOPs" in the 1B A100 table's notes
  // Attention: QK^T and PV, 2 FLOPs per multiply-add, causal average context (T + 1) / 2.
  CHECK(f.attention_forward == Approx(4.0 * 16 * 2048 * 1025 / 2.0));
  CHECK(f.train() == Approx(3 * f.forward()));
  CHECK(f.train(true) == Approx(4 * f.forward()));
  CHECK(kiln::cost::six_n_per_token(c) == 6.0 * 1235814400.0);
}
