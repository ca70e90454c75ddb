// HF Trainer's step arithmetic and banner. Reference: the two real HF Trainer logs in
// shared/seed/pretrain-history.txt (Llama-3.2-1B, 16,527,707 and 826,279 examples).
#include <catch2/catch.hpp>

#include "kiln/train/step_math.h"

using kiln::train::plan_steps;

TEST_CASE("step arithmetic reproduces the user's HF Trainer logs", "[train]") {
  // batch 8, accumulation 1, 3 epochs
  const auto a = plan_steps(16527707, 8, 1, 1, 3.0, -1);
  CHECK(a.total_steps == 6197892);
  CHECK(a.total_batch_size() == 8);
  CHECK(kiln::train::training_banner(a, 1235814400) ==
        "***** Running training *****\n"
        "  Num examples = 16,527,707\n"
        "  Num Epochs = 3\n"
        "  Instantaneous batch size per device = 8\n"
        "  Total train batch size (w. parallel, distributed & accumulation) = 8\n"
        "  Gradient Accumulation steps = 1\n"
        "  Total optimization steps = 6,197,892\n"
        "  Number of trainable parameters = 1,235,814,400");
  // batch 1, accumulation 8, 3 epochs
  const auto b = plan_steps(826279, 1, 1, 8, 3.0, -1);
  CHECK(b.total_steps == 309852);
  CHECK(b.total_batch_size() == 8);
}

TEST_CASE("step arithmetic edge cases follow HF", "[train]") {
  // ceil over ranks and batch; at least one update per epoch even with huge accumulation
  const auto p = plan_steps(10, 3, 2, 100, 2.0, -1);
  CHECK(p.batches_per_epoch == 2);  // ceil(10 / 6)
  CHECK(p.updates_per_epoch == 1);
  CHECK(p.total_steps == 2);
  CHECK(p.total_batch_size() == 600);
  // fractional epochs: ceil(epochs * updates per epoch)
  CHECK(plan_steps(100, 10, 1, 1, 0.25, -1).total_steps == 3);
  // max_steps wins; epochs become the number needed to reach it
  const auto m = plan_steps(100, 10, 1, 1, 3.0, 25);
  CHECK(m.total_steps == 25);
  CHECK(m.num_epochs == 3.0);
}
