// HF Trainer's step arithmetic and banner. References: the two real HF Trainer logs in
// configs/reference/llamafactory_runs.yaml (Llama-3.2-1B, 16,527,707 and 826,279 examples; transformers
// <= 4.51, floor), and transformers 5.6.0's set_initial_training_values run by
// tests/python/llamafactory_reference.py --banner-only (ceil: the last, shorter window is a step).
#include <catch2/catch.hpp>

#include "kiln/train/step_plan.h"

using kiln::train::plan_steps;

TEST_CASE("step arithmetic reproduces the user's HF Trainer logs", "[train]") {
  // The user's log (an older transformers) has every line but "Num update steps per epoch",
  // which transformers 5.6.0 (LLaMA-Factory 0.9.5's) adds after "Num Epochs".
  // batch 8, accumulation 1, 3 epochs
  const auto a = plan_steps(16527707, 8, 1, 1, 3.0, -1);
  CHECK(a.total_steps == 6197892);
  CHECK(a.total_batch_size() == 8);
  CHECK(kiln::train::training_banner(a, 1235814400) ==
        "***** Running training *****\n"
        "  Num examples = 16,527,707\n"
        "  Num Epochs = 3\n"
        "  Num update steps per epoch = 2,065,964\n"
        "  Instantaneous batch size per device = 8\n"
        "  Total train batch size (w. parallel, distributed & accumulation) = 8\n"
        "  Gradient Accumulation steps = 1\n"
        "  Total optimization steps = 6,197,892\n"
        "  Number of trainable parameters = 1,235,814,400");
  // batch 1, accumulation 8, 3 epochs: the user's log says 309,852 = 3 x floor(826,279 / 8)
  // (transformers <= 4.51 dropped the 7-batch window); transformers 5.6.0, which LLaMA-Factory
  // 0.9.5 installs, prints "Num update steps per epoch = 103,285" and 309,855.
  const auto b = plan_steps(826279, 1, 1, 8, 3.0, -1);
  CHECK(b.updates_per_epoch == 103285);
  CHECK(b.last_window_batches() == 7);
  CHECK(b.total_steps == 309855);
  CHECK(b.total_batch_size() == 8);
}

TEST_CASE("step arithmetic: LLaMA-Factory 0.9.5's fixture figures", "[train]") {
  // docs/llamafactory.md section 8: 390 blocks, batch 2, accumulation 4, 3 epochs -> 195
  // batches, 49 update steps per epoch (the last window 3 batches), 147 steps.
  const auto p = plan_steps(390, 2, 1, 4, 3.0, -1);
  CHECK(p.batches_per_epoch == 195);
  CHECK(p.updates_per_epoch == 49);
  CHECK(p.last_window_batches() == 3);
  CHECK(p.total_steps == 147);
  // val_size 20: 418 blocks -> 209 batches, 53 steps per epoch, the last window 1 batch.
  const auto q = plan_steps(418, 2, 1, 4, 3.0, -1);
  CHECK(q.total_steps == 159);
  CHECK(q.last_window_batches() == 1);
  CHECK(kiln::train::evaluation_banner(57, 8) ==
        "***** Running Evaluation *****\n"
        "  Num examples = 57\n"
        "  Batch size = 8");
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
