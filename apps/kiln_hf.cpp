// kiln-hf: Hugging Face checkpoints from the command line, and kiln's side of the golden parity
// tests (tests/python/test_hf_parity.py). The tests run transformers in Python and kiln through
// this program, exchanging tensors as safetensors files, so kiln never loads Python.
//
//   kiln-hf init    --model PRESET|YAML --out DIR [--seed N] [--dtype D]   fresh model -> HF dir
//   kiln-hf convert --model DIR --out DIR [--dtype D] [--max-shard-bytes N] load and save again
//   kiln-hf forward --model DIR --batch FILE --out FILE [--grads] [--dtype D] [--fused-loss] [--autocast D]
//                   [--kernels SPEC]
//   kiln-hf train   --model DIR --batch FILE --out DIR [--steps N] [--lr X] [--dtype D]
//   kiln-hf inspect --in FILE|DIR                 list tensors (name, dtype, shape) and metadata
//   kiln-hf copy    --in FILE --out FILE          read every tensor and write them all again
//   kiln-hf optimizer --model DIR --out FILE      DIR/optimizer.pt (transformers' AdamW) read as
//                   kiln-pretrain's resume reads it, into kiln's AdamW over DIR's model; writes
//                   that AdamW's state ("<param>.exp_avg", ".exp_avg_sq", ".step") as safetensors
//
// A batch file is safetensors with "input_ids" [B, T] (I64) and optionally "labels" [B, T]
// (default: input_ids). forward writes "logits" [B, T, V], "loss" [] and, with --grads,
// "grad.<parameter name>" for every parameter (all in the model dtype, the loss in fp32).
// --fused-loss computes the loss as the trainer does (ops::linear_cross_entropy, no logits are
// written) and --autocast bf16|fp16 runs the forward under autocast with the checkpoint's fp32
// weights, as the trainer's mixed precision does: scripts/bench_vs_hf.py checks with them that
// kiln's training step and transformers' compute the same loss on the same batch.
// The keys (settings.h): each command's through one table, also from --config FILE; --model is the
// key model for init (a preset, as kiln-pretrain's) and model_name_or_path for the others.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adamw.h>

#include "cli.h"
#include "kiln/common/dtype_names.h"
#include "kiln/common/format.h"
#include "kiln/io/safetensors.h"
#include "kiln/model/hf.h"
#include "kiln/model/llama.h"
#include "kiln/ops/dispatch.h"
#include "kiln/optim/adamw.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/hf/checkpoint_layout.h"
#include "kiln/train/hf/hf_optimizer_files.h"
#include "settings.h"

namespace {

using kiln::model::LlamaForCausalLM;

// A dtype key's value (checked by read_hf_settings): fp32, bf16, fp16 or fp64; "" = none.
std::optional<at::ScalarType> parse_dtype(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return kiln::dtype_from_name(s);
}

struct Batch {
  at::Tensor input_ids;  // [B, T] int64
  at::Tensor labels;     // [B, T] int64, -100 = ignore
};

Batch read_batch(const std::string& path) {
  kiln::io::SafetensorsFile file(path);
  auto ids = [&](const char* name) {
    const at::Tensor t = file.tensor(name);
    if (t.scalar_type() != at::kLong || t.dim() != 2) {
      throw std::invalid_argument(fmt::format("{}: tensor '{}' must be I64 [B, T], got {} with {} dims", path, name,
                                              c10::toString(t.scalar_type()), t.dim()));
    }
    return t.clone();
  };
  Batch b{ids("input_ids"), {}};
  b.labels = file.contains("labels") ? ids("labels") : b.input_ids;
  if (b.labels.sizes() != b.input_ids.sizes()) {
    throw std::invalid_argument(fmt::format("{}: 'labels' must have the shape of 'input_ids'", path));
  }
  return b;
}

void inspect(const std::string& path) {
  const auto print = [](const kiln::io::TensorInfo& t) {
    fmt::print("{}\t{}\t[{}]\n", t.name, kiln::io::safetensors_dtype_name(t.dtype), fmt::join(t.shape, ", "));
  };
  if (std::filesystem::is_directory(path)) {
    kiln::io::SafetensorsCheckpoint checkpoint(path);
    for (const auto& name : checkpoint.names()) print(checkpoint.info(name));
    for (const auto& [key, value] : checkpoint.metadata()) fmt::print("metadata\t{}\t{}\n", key, value);
    return;
  }
  kiln::io::SafetensorsFile file(path);
  for (const auto& name : file.names()) print(file.info(name));
  for (const auto& [key, value] : file.metadata()) fmt::print("metadata\t{}\t{}\n", key, value);
}

int run(const kiln::cli::HfSettings& args) {
  const std::string& command = args.command;
  if (command == "inspect") {
    inspect(args.required("in"));
    return 0;
  }
  if (command == "copy") {
    kiln::io::SafetensorsFile file(args.required("in"));
    kiln::io::NamedTensors tensors;
    for (const auto& name : file.names()) tensors.emplace_back(name, file.tensor(name));
    kiln::io::save_safetensors(args.required("out"), tensors, file.metadata());
    return 0;
  }
  const auto dtype = parse_dtype(args.dtype);
  kiln::model::SaveOptions save_options;
  save_options.max_shard_bytes = static_cast<uint64_t>(args.max_shard_bytes);
  if (command == "init") {
    LlamaForCausalLM model(kiln::model::load_llama_config(args.required("model")),
                           at::TensorOptions().dtype(dtype.value_or(at::kFloat)));
    model->init_weights(static_cast<uint64_t>(args.seed));
    kiln::model::save_pretrained(model, args.required("out"), save_options);
    return 0;
  }
  LlamaForCausalLM model = kiln::model::load_pretrained(args.required("model_name_or_path"), {.dtype = dtype});
  if (command == "convert") {
    kiln::model::save_pretrained(model, args.required("out"), save_options);
    return 0;
  }
  if (command == "optimizer") {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    kiln::optim::AdamW optimizer(named, kiln::optim::AdamWConfig{});
    const std::string dir = args.required("model_name_or_path");
    kiln::train::load_hf_optimizer_file((std::filesystem::path(dir) / kiln::train::kHfOptimizerFile).string(), model,
                                        optimizer);
    kiln::io::NamedTensors tensors;
    for (const auto& [name, t] : optimizer.state_dict()) tensors.emplace_back(name, t);
    kiln::io::save_safetensors(args.required("out"), tensors);
    return 0;
  }
  const Batch batch = read_batch(args.required("batch"));
  if (command == "forward") {
    const bool grads = args.grads;
    const std::optional<at::ScalarType> autocast = parse_dtype(args.autocast);  // bf16 or fp16 (checked)
    model->fused_lm_loss = args.fused_loss;
    try {
      kiln::ops::set_backends(args.kernels);  // throws naming a bad item
    } catch (const std::invalid_argument& e) {
      args.given.fail("kernels", e.what());
    }
    at::AutoGradMode grad_mode(grads);
    kiln::model::CausalLMOutput out;
    {
      const kiln::train::AutocastGuard autocast_guard(at::kCPU, autocast);
      out = model->forward(batch.input_ids, batch.labels);
    }
    kiln::io::NamedTensors tensors = {{"loss", out.loss.detach().to(at::kFloat)}};
    if (out.logits.defined()) tensors.insert(tensors.begin(), {"logits", out.logits.detach()});
    if (grads) {
      out.loss.backward();
      for (const auto& item : model->named_parameters(true))
        tensors.emplace_back("grad." + item.key(), item.value().grad());
    }
    kiln::io::save_safetensors(args.required("out"), tensors);
    return 0;
  }
  if (command == "train") {
    const int64_t steps = args.max_steps;
    torch::optim::AdamW optimizer(model->parameters(),
                                  torch::optim::AdamWOptions(args.learning_rate).weight_decay(0.0));
    for (int64_t step = 1; step <= steps; ++step) {
      optimizer.zero_grad();
      const auto out = model->forward(batch.input_ids, batch.labels);
      out.loss.backward();
      optimizer.step();
      fmt::print("step {} loss {:.6f}\n", step, out.loss.item<double>());
    }
    kiln::model::save_pretrained(model, args.required("out"), save_options);
    return 0;
  }
  throw std::logic_error("kiln-hf: command '" + command + "' has keys but no code");
}

const char* const kUsage =
    "Usage: kiln-hf COMMAND [--KEY VALUE ...]\n\n"
    "Hugging Face checkpoints. COMMAND:\n"
    "  init      --model PRESET|YAML --out DIR                    a fresh model as an HF folder\n"
    "  convert   --model_name_or_path DIR --out DIR               load and save again\n"
    "  forward   --model_name_or_path DIR --batch FILE --out FILE logits, loss (and gradients) as safetensors\n"
    "  train     --model_name_or_path DIR --batch FILE --out DIR  AdamW steps on the batch, then save\n"
    "  inspect   --in FILE|DIR                                    list tensors (name, dtype, shape) and metadata\n"
    "  copy      --in FILE --out FILE                             read every tensor and write them all again\n"
    "  optimizer --model_name_or_path DIR --out FILE              DIR/optimizer.pt as kiln-pretrain's resume reads it\n"
    "--model DIR is the older spelling of --model_name_or_path DIR (init: the key model).\n"
    "kiln-hf COMMAND --help lists the command's keys; all of them:";

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string command = argc > 1 && argv[1][0] != '-' ? argv[1] : "";
    const auto line = kiln::config::parse_command_line(kiln::cli::arguments(argc, argv, command.empty() ? 1 : 2),
                                                       kiln::cli::hf_spelling(command));
    if (line.help || command.empty()) {
      const bool known = std::find(kiln::cli::hf_commands().begin(), kiln::cli::hf_commands().end(), command) !=
                         kiln::cli::hf_commands().end();
      const std::string usage =
          known ? fmt::format("Usage: kiln-hf {} [--KEY VALUE ...]; its keys:", command) : std::string(kUsage);
      std::cout << kiln::cli::settings_help(usage, kiln::cli::hf_keys(known ? command : ""));
      return line.help ? 0 : 2;
    }
    return run(kiln::cli::read_hf_settings(command, line));
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-hf: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
