// kiln-smoke: builds a LLaMA from a preset and trains it for a few steps on a synthetic language
// (a seeded Markov chain whose next token is predictable 90% of the time), printing the loss.
// It exits non-zero unless the loss falls clearly below that of uniform guessing, so it doubles
// as an end-to-end check of model, autograd and optimizer on any device. It stands in for
// kiln-pretrain's quick start until the trainer exists.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>

#include "cli.h"
#include "kiln/common/dtype_names.h"
#include "kiln/common/format.h"
#include "kiln/model/llama.h"
#include "settings.h"

namespace {

// Token sequences where token t+1 = successor[token t] with probability 0.9, else uniform.
// The best achievable loss is about 0.9 * -ln(0.9) + 0.1 * (ln(V) + ...) ~= 0.9 nats for V = 320.
at::Tensor synthetic_batch(const at::Tensor& successor, int64_t batch, int64_t seq, at::Generator& gen) {
  const int64_t vocab = successor.size(0);
  at::Tensor ids = at::empty({batch, seq}, at::kLong);
  ids.select(1, 0).random_(0, vocab, gen);
  const at::Tensor jump = at::rand({batch, seq}, gen) < 0.1;
  const at::Tensor noise = at::randint(0, vocab, {batch, seq}, gen, at::kLong);
  for (int64_t t = 1; t < seq; ++t) {
    const at::Tensor next = successor.index_select(0, ids.select(1, t - 1));
    ids.select(1, t).copy_(at::where(jump.select(1, t), noise.select(1, t), next));
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto line = kiln::config::parse_command_line(kiln::cli::arguments(argc, argv), kiln::cli::smoke_spelling());
    if (line.help) {
      std::cout << kiln::cli::settings_help(
          "Usage: kiln-smoke [--KEY VALUE ...]\n\n"
          "Train a LLaMA preset for a few steps on synthetic data and check the loss falls.",
          kiln::cli::smoke_keys());
      return 0;
    }
    const kiln::cli::SmokeSettings s = kiln::cli::read_smoke_settings(line);
    const auto config = kiln::model::load_llama_config(s.model);
    const at::ScalarType dtype = kiln::dtype_from_name(s.dtype);  // checked by read_smoke_settings
    const at::Device device = kiln::cli::device(s.given, s.device);
    const std::string device_name = device.is_cuda() ? "cuda" : "cpu";
    const int64_t steps = s.max_steps, batch = s.per_device_train_batch_size, seq = s.cutoff_len;
    const auto seed = static_cast<uint64_t>(s.seed);

    kiln::model::LlamaForCausalLM model(config, at::TensorOptions().device(device).dtype(dtype));
    model->init_weights(seed);
    fmt::print("kiln-smoke: model {} ({} parameters), {} on {}, {} steps of {} x {} tokens\n", config.source,
               kiln::with_commas(model->num_parameters()), s.dtype, device_name, steps, batch, seq);

    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
    const at::Tensor successor = at::randperm(config.vocab_size, gen, at::kLong);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(s.learning_rate).weight_decay(0.0));

    const double uniform = std::log(static_cast<double>(config.vocab_size));
    double first = 0, last = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t step = 1; step <= steps; ++step) {
      const at::Tensor ids = synthetic_batch(successor, batch, seq, gen).to(device);
      optimizer.zero_grad();
      const auto out = model->forward(ids, ids);
      out.loss.backward();
      optimizer.step();
      last = out.loss.item<double>();
      if (step == 1) first = last;
      if (step == 1 || step % 10 == 0 || step == steps) fmt::print("step {:>5}  loss {:.4f}\n", step, last);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("kiln-smoke: loss {:.4f} -> {:.4f} (uniform guessing: {:.4f}), {:.0f} tokens/s\n", first, last, uniform,
               static_cast<double>(steps * batch * seq) / seconds);
    if (!std::isfinite(last) || last > 0.75 * uniform) {
      fmt::print(stderr, "kiln-smoke: FAILED: the loss did not fall below 75% of uniform guessing\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-smoke: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
