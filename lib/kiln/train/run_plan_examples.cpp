// examples_json: what a planned run would train and evaluate on, without training (run_plan.h).
#include <algorithm>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "kiln/data/loader.h"
#include "kiln/data/stream_dataset.h"
#include "kiln/train/run_plan.h"

namespace kiln::train {

using json = nlohmann::json;

namespace {

json split_json(const data::PackedDataset& set, const data::LoaderOptions& train_options, int64_t limit) {
  data::LoaderOptions o;
  o.batch_size = 1;
  o.shuffle = false;
  o.prefetch = 0;
  o.ignore_label_id = train_options.ignore_label_id;
  o.pad_id = train_options.pad_id;
  data::DataLoader loader(std::make_shared<data::PackedDataset>(set), o);
  const int64_t n = set.num_blocks();
  const int64_t shown = limit < 0 ? n : std::min(limit, n);
  int64_t tokens = 0;
  std::set<int64_t> lengths;
  for (int64_t i = 0; i < n; ++i) {
    tokens += set.example_length(i);
    lengths.insert(set.example_length(i));
  }
  json examples = json::array();
  for (int64_t i = 0; i < shown; ++i) {
    const data::Batch b = loader.next();
    const int64_t len = set.example_length(i);
    const auto* ids = b.input_ids.data_ptr<int64_t>();
    const auto* labels = b.labels.data_ptr<int64_t>();
    examples.push_back(
        {{"input_ids", std::vector<int64_t>(ids, ids + len)}, {"labels", std::vector<int64_t>(labels, labels + len)}});
  }
  return {{"num_examples", n},
          {"total_tokens", tokens},
          {"lengths", std::vector<int64_t>(lengths.begin(), lengths.end())},
          {"examples", std::move(examples)}};
}

json batch_rows(const data::Batch& b) {
  json rows = json::array();
  const int64_t n = b.input_ids.size(0), len = b.input_ids.size(1);
  for (int64_t r = 0; r < n; ++r) {
    const auto* ids = b.input_ids.data_ptr<int64_t>() + r * len;
    const auto* labels = b.labels.data_ptr<int64_t>() + r * len;
    rows.push_back(
        {{"input_ids", std::vector<int64_t>(ids, ids + len)}, {"labels", std::vector<int64_t>(labels, labels + len)}});
  }
  return rows;
}

// streaming: the train micro-batches of the run's max_steps optimizer steps in the order the
// trainer draws them (data::next_stream_step, as the trainer), each with its window's
// num_items_in_batch, and HF's state.epoch after each step; the batches of one evaluation. The
// layout is llamafactory_reference.py's stream_run.
json stream_json(const RunPlan& plan) {
  const RunData& d = plan.data;
  const StepPlan& p = plan.steps;
  data::StreamSpec spec = *d.train_stream;
  spec.batches.pin_memory = false;
  data::StreamLoader loader(spec);
  json micro = json::array(), steps = json::array();
  for (int64_t s = 0; s < p.total_steps; ++s) {
    const data::StreamStep step = data::next_stream_step(loader, p.gradient_accumulation_steps);
    for (size_t i = 0; i < step.batches.size(); ++i) {
      micro.push_back({{"rows", batch_rows(step.batches[i])}, {"num_items_in_batch", step.window_items[i]}});
    }
    steps.push_back({{"micro_batches", micro.size()},
                     {"epoch", data::stream_epoch_progress(loader, p.total_steps, p.gradient_accumulation_steps)}});
  }
  json out = {{"train", {{"micro_batches", std::move(micro)}, {"steps", std::move(steps)}}}};
  if (d.eval_stream) {
    data::StreamSpec eval_spec = *d.eval_stream;
    eval_spec.batches.pin_memory = false;
    data::StreamLoader eval(eval_spec);
    json batches = json::array();
    while (const std::optional<data::Batch> b = eval.next()) batches.push_back(batch_rows(*b));
    out["eval"] = {{"batches", std::move(batches)}};
  }
  return out;
}

// The banner's figures, as the reference harness reduces LLaMA-Factory's Trainer to them.
json trainer_json(const StepPlan& p, json eval_num_examples) {
  return {{"num_examples", p.num_examples},
          {"num_epochs", p.banner_epochs()},
          {"per_device_train_batch_size", p.batch_size_per_device},
          {"total_train_batch_size", p.total_batch_size()},
          {"gradient_accumulation_steps", p.gradient_accumulation_steps},
          {"num_update_steps_per_epoch", p.updates_per_epoch},
          {"max_steps", p.total_steps},
          {"batches_per_epoch", p.batches_per_epoch},
          {"last_window_batches", p.last_window_batches()},
          {"eval_num_examples", std::move(eval_num_examples)}};
}

}  // namespace

std::string examples_json(const RunPlan& plan, int64_t limit) {
  const RunData& d = plan.data;
  if (d.train_stream) {
    const StepPlan& p = plan.steps;
    json out = {{"train", nullptr}, {"eval", nullptr}, {"stream", stream_json(plan)}};
    out["trainer"] = trainer_json(p, nullptr);
    out["trainer"]["sampler"] = {{"seed", d.loader.seed}, {"orders", json::object()}};
    return out.dump();
  }
  if (!d.train) throw std::logic_error("examples_json: this run's batches come from the host");
  json out;
  out["train"] = split_json(*d.train, d.loader, limit);
  // With eval_on_each_dataset, per dataset by name (LLaMA-Factory's eval_dataset dict).
  out["eval"] = d.val ? split_json(*d.val, d.loader, limit) : json(nullptr);
  json eval_examples = d.val ? json(d.val->num_blocks()) : json(nullptr);
  if (!d.named_evals.empty()) {
    out["eval"] = eval_examples = json::object();
    for (const auto& [name, set] : d.named_evals) {
      out["eval"][name] = split_json(*set, d.loader, limit);
      eval_examples[name] = set->num_blocks();
    }
  }
  const StepPlan& p = plan.steps;
  json trainer = trainer_json(p, eval_examples);
  // The sampler's first epochs (as many as the run has, at most 3), each its first 100 indices
  // for large sets.
  data::LoaderOptions o = d.loader;
  o.prefetch = 0;
  o.batch_size = 1;
  o.rank = 0;
  o.world_size = 1;
  data::DataLoader loader(d.train, o);
  json orders = json::object();
  const int64_t epochs = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(std::ceil(p.num_epochs)), 1), 3);
  for (int64_t e = 0; e < epochs; ++e) {
    std::vector<int64_t> order = loader.epoch_order(e);
    if (order.size() > 2000) order.resize(100);
    orders[std::to_string(e)] = order;
  }
  trainer["sampler"] = {{"seed", o.seed}, {"orders", std::move(orders)}};
  out["trainer"] = std::move(trainer);
  return out.dump();
}

}  // namespace kiln::train
