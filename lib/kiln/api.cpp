// The public API (kiln/kiln.h) over kiln's internals: thin conversions, no behaviour of its own.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/config/yaml.h"
#include "kiln/kiln.h"
#include "kiln/model/generate.h"
#include "kiln/model/hf.h"
#include "kiln/model/llama.h"
#include "kiln/train/evaluate.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/trainer.h"

namespace kiln {

namespace {

model::LlamaForCausalLM holder(const Model& m) {
  return model::LlamaForCausalLM(m.impl());
}

EvalResult from_internal(const train::EvalResult& r) {
  return {.loss = r.loss, .perplexity = r.perplexity, .tokens = r.tokens, .interrupted = r.interrupted};
}

train::BatchSource to_internal(BatchSource source) {
  if (!source) return {};
  return [source = std::move(source)]() -> std::optional<train::MicroBatch> {
    std::optional<Batch> b = source();
    if (!b) return std::nullopt;
    return train::MicroBatch{std::move(b->input_ids), std::move(b->labels), at::Tensor()};
  };
}

}  // namespace

std::string version() {
  return KILN_VERSION_STRING;
}

// ---- Model ----

Model::Model(std::shared_ptr<model::LlamaForCausalLMImpl> impl) : impl_(std::move(impl)) {
  if (!impl_) throw std::invalid_argument("kiln::Model: no model");
}

Model Model::create(const std::string& preset_or_yaml, const ModelOptions& o) {
  model::LlamaForCausalLM m(model::load_llama_config(preset_or_yaml),
                            at::TensorOptions().device(o.device).dtype(o.dtype.value_or(at::kFloat)));
  m->init_weights(o.seed);
  return Model(m.ptr());
}

Model Model::from_pretrained(const std::string& dir, const ModelOptions& o) {
  return Model(model::load_pretrained(dir, {.dtype = o.dtype, .device = o.device}).ptr());
}

void Model::save_pretrained(const std::string& dir) const {
  model::save_pretrained(*impl_, dir);
}

int64_t Model::num_parameters() const {
  return impl_->num_parameters();
}

int64_t Model::vocab_size() const {
  return impl_->config().vocab_size;
}

int64_t Model::max_position_embeddings() const {
  return impl_->config().max_position_embeddings;
}

c10::Device Model::device() const {
  return impl_->parameters().front().device();
}

at::Tensor Model::logits(const at::Tensor& input_ids) const {
  at::NoGradGuard no_grad;
  const bool training = impl_->is_training();
  impl_->eval();
  at::Tensor out = impl_->forward(input_ids.to(device())).logits;
  impl_->train(training);
  return out;
}

// ---- Evaluation, generation ----

EvalResult evaluate(const Model& model, const BatchSource& source, const EvalOptions& options) {
  if (!source) throw std::invalid_argument("kiln::evaluate: no batch source");
  auto m = holder(model);
  train::EvalOptions o;
  o.device = model.device();
  if (options.bf16) o.autocast_dtype = at::kBFloat16;
  const bool training = m->is_training();
  const auto r = train::evaluate_batches(m, to_internal(source), o);
  m->train(training);
  return from_internal(r);
}

std::vector<int64_t> generate(const Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  auto m = holder(model);
  const bool training = m->is_training();
  const auto out = model::generate(m, prompt,
                                   {.max_new_tokens = o.max_new_tokens,
                                    .greedy = o.greedy,
                                    .temperature = o.temperature,
                                    .top_k = o.top_k,
                                    .top_p = o.top_p,
                                    .eos_token_id = o.eos_token_id,
                                    .seed = o.seed,
                                    .vocab_limit = o.vocab_limit});
  m->train(training);
  return out;
}

// ---- Training ----

TrainConfig train_config_from_yaml(const std::string& yaml_text, const std::string& source) {
  return train::pretrain_config_from_yaml_text(yaml_text, source);
}

StopToken::StopToken() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
void StopToken::request_stop() const {
  flag_->store(true);
}
bool StopToken::stop_requested() const {
  return flag_->load();
}

Trainer::Trainer(const TrainConfig& config) : impl_(std::make_unique<train::Trainer>(config)) {
  set_stop_token(stop_);
}

Trainer::Trainer(const TrainConfig& config, BatchSource source) {
  if (!source) throw std::invalid_argument("kiln::Trainer: the batch source is empty");
  impl_ = std::make_unique<train::Trainer>(config, to_internal(std::move(source)));
  set_stop_token(stop_);
}

Trainer::~Trainer() = default;
Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;

void Trainer::set_callbacks(TrainCallbacks c) {
  train::TrainerCallbacks internal;
  internal.on_step = std::move(c.on_step);
  internal.on_log = std::move(c.on_log);
  internal.on_save = std::move(c.on_save);
  if (c.on_evaluate) {
    internal.on_evaluate = [f = std::move(c.on_evaluate)](int64_t step, const train::EvalResult& r) {
      f(step, from_internal(r));
    };
  }
  impl_->set_callbacks(std::move(internal));
}

void Trainer::set_stop_token(StopToken token) {
  stop_ = std::move(token);
  impl_->set_stop_check([token = stop_] { return token.stop_requested(); });
}

std::string Trainer::banner() const {
  return impl_->banner();
}

int64_t Trainer::total_steps() const {
  return impl_->plan().total_steps;
}

TrainResult Trainer::train() {
  const train::TrainResult r = impl_->train();
  TrainResult out;
  out.global_step = r.global_step;
  out.interrupted = r.interrupted;
  out.data_exhausted = r.data_exhausted;
  out.last_checkpoint = r.last_checkpoint;
  out.final_loss = r.final_loss;
  if (r.final_eval) out.final_eval = from_internal(*r.final_eval);
  return out;
}

EvalResult Trainer::evaluate() {
  return from_internal(impl_->evaluate());
}

EvalResult Trainer::evaluate(const BatchSource& source) {
  if (!source) throw std::invalid_argument("kiln::Trainer::evaluate: no batch source");
  return from_internal(impl_->evaluate(to_internal(source)));
}

Model Trainer::model() const {
  return Model(impl_->model().ptr());
}

}  // namespace kiln
