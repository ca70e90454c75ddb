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
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adamw.h>
#include <cxxopts.hpp>

#include "cli.h"
#include "kiln/common/format.h"
#include "kiln/io/safetensors.h"
#include "kiln/model/hf.h"
#include "kiln/model/llama.h"
#include "kiln/ops/dispatch.h"
#include "kiln/optim/adamw.h"
#include "kiln/train/hf/hf_optimizer_files.h"
#include "kiln/train/step.h"

namespace {

using kiln::model::LlamaForCausalLM;

std::optional<at::ScalarType> parse_dtype(const std::string& s) {
  if (s.empty()) return std::nullopt;
  if (s == "fp32") return at::kFloat;
  if (s == "bf16") return at::kBFloat16;
  if (s == "fp16") return at::kHalf;
  if (s == "fp64") return at::kDouble;
  throw std::invalid_argument(fmt::format("--dtype must be fp32, bf16, fp16 or fp64, got '{}'", s));
}

std::string required(const cxxopts::ParseResult& args, const char* key) {
  if (!args.count(key)) throw std::invalid_argument(fmt::format("--{} is required", key));
  return args[key].as<std::string>();
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

// The options each command reads: one given to another command would be silently ignored.
void check_command_options(const std::string& command, const cxxopts::ParseResult& args) {
  static const std::map<std::string, std::set<std::string>> reads = {
      {"inspect", {"in"}},
      {"copy", {"in", "out"}},
      {"init", {"model", "out", "dtype", "seed", "max-shard-bytes"}},
      {"convert", {"model", "out", "dtype", "max-shard-bytes"}},
      {"forward", {"model", "batch", "out", "dtype", "grads", "fused-loss", "autocast", "kernels"}},
      {"train", {"model", "batch", "out", "dtype", "steps", "lr", "max-shard-bytes"}},
      {"optimizer", {"model", "out"}}};
  const auto it = reads.find(command);
  if (it == reads.end()) return;  // run() names an unknown command
  for (const auto& kv : args.arguments()) {
    if (kv.key() != "command" && !it->second.count(kv.key())) {
      throw std::invalid_argument(fmt::format("--{} does not apply to {} (kiln-hf --help)", kv.key(), command));
    }
  }
}

int run(const std::string& command, const cxxopts::ParseResult& args) {
  check_command_options(command, args);
  if (command == "inspect") {
    inspect(required(args, "in"));
    return 0;
  }
  if (command == "copy") {
    kiln::io::SafetensorsFile file(required(args, "in"));
    kiln::io::NamedTensors tensors;
    for (const auto& name : file.names()) tensors.emplace_back(name, file.tensor(name));
    kiln::io::save_safetensors(required(args, "out"), tensors, file.metadata());
    return 0;
  }
  const auto dtype = parse_dtype(kiln::cli::optional_string(args, "dtype"));
  kiln::model::SaveOptions save_options;
  save_options.max_shard_bytes = args["max-shard-bytes"].as<uint64_t>();
  if (command == "init") {
    LlamaForCausalLM model(kiln::model::load_llama_config(required(args, "model")),
                           at::TensorOptions().dtype(dtype.value_or(at::kFloat)));
    model->init_weights(args["seed"].as<uint64_t>());
    kiln::model::save_pretrained(model, required(args, "out"), save_options);
    return 0;
  }
  LlamaForCausalLM model = kiln::model::load_pretrained(required(args, "model"), {.dtype = dtype});
  if (command == "convert") {
    kiln::model::save_pretrained(model, required(args, "out"), save_options);
    return 0;
  }
  if (command == "optimizer") {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    kiln::optim::AdamW optimizer(named, kiln::optim::AdamWConfig{});
    const std::string dir = required(args, "model");
    kiln::train::load_hf_optimizer_file((std::filesystem::path(dir) / "optimizer.pt").string(), model, optimizer);
    kiln::io::NamedTensors tensors;
    for (const auto& [name, t] : optimizer.state_dict()) tensors.emplace_back(name, t);
    kiln::io::save_safetensors(required(args, "out"), tensors);
    return 0;
  }
  const Batch batch = read_batch(required(args, "batch"));
  if (command == "forward") {
    const bool grads = args.count("grads") != 0;
    const std::string autocast_name = kiln::cli::optional_string(args, "autocast");
    std::optional<at::ScalarType> autocast;
    if (!autocast_name.empty()) {
      autocast = parse_dtype(autocast_name);
      if (autocast != at::kBFloat16 && autocast != at::kHalf)
        throw std::invalid_argument(fmt::format("--autocast must be bf16 or fp16, got '{}'", autocast_name));
    }
    model->fused_lm_loss = args.count("fused-loss") != 0;
    kiln::ops::set_backends(args["kernels"].as<std::string>());  // throws naming a bad item
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
    kiln::io::save_safetensors(required(args, "out"), tensors);
    return 0;
  }
  if (command == "train") {
    const int64_t steps = args["steps"].as<int64_t>();
    if (steps < 0) throw std::invalid_argument("--steps must be >= 0");
    torch::optim::AdamW optimizer(model->parameters(),
                                  torch::optim::AdamWOptions(args["lr"].as<double>()).weight_decay(0.0));
    for (int64_t step = 1; step <= steps; ++step) {
      optimizer.zero_grad();
      const auto out = model->forward(batch.input_ids, batch.labels);
      out.loss.backward();
      optimizer.step();
      fmt::print("step {} loss {:.6f}\n", step, out.loss.item<double>());
    }
    kiln::model::save_pretrained(model, required(args, "out"), save_options);
    return 0;
  }
  throw std::invalid_argument(
      fmt::format("unknown command '{}' (init, convert, forward, train, inspect, copy, optimizer)", command));
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options(
      "kiln-hf",
      "Hugging Face checkpoints. COMMAND: init, convert, forward (+ gradients), train, inspect, copy or optimizer");
  // clang-format off
  options.add_options()
    ("command", "init, convert, forward, train, inspect, copy or optimizer", cxxopts::value<std::string>())
    ("model", "HF checkpoint directory (init: preset name or model YAML)", cxxopts::value<std::string>())
    ("out", "output directory (init, convert, train) or safetensors file (forward)", cxxopts::value<std::string>())
    ("in", "inspect, copy: safetensors file (inspect: or checkpoint directory)", cxxopts::value<std::string>())
    ("batch", "safetensors file with input_ids [B, T] and optional labels", cxxopts::value<std::string>())
    ("dtype", "fp32, bf16, fp16 or fp64 (default: the checkpoint's)", cxxopts::value<std::string>())
    ("grads", "forward: also write every parameter's gradient of the loss")
    ("fused-loss", "forward: the trainer's loss (chunked linear + cross-entropy; no logits written)")
    ("autocast", "forward: bf16 or fp16 autocast over fp32 weights, as the trainer's mixed precision", cxxopts::value<std::string>())
    ("kernels", "forward: ops backends as kiln-pretrain's key, e.g. kiln,linear=aten", cxxopts::value<std::string>()->default_value(kiln::ops::kDefaultKernels))
    ("steps", "train: AdamW steps on the batch", cxxopts::value<int64_t>()->default_value("3"))
    ("lr", "train: learning rate", cxxopts::value<double>()->default_value("1e-3"))
    ("seed", "init: weight seed", cxxopts::value<uint64_t>()->default_value("0"))
    ("max-shard-bytes", "largest safetensors file written before sharding",
     cxxopts::value<uint64_t>()->default_value("5000000000"))
    ("h,help", "print this help");
  // clang-format on
  options.parse_positional({"command"});
  options.positional_help("COMMAND");
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help") || !args.count("command")) {
      std::cout << options.help() << "\n";
      return args.count("help") ? 0 : 2;
    }
    return run(args["command"].as<std::string>(), args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-hf: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
