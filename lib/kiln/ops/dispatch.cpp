#include "kiln/ops/dispatch.h"

#include <array>
#include <atomic>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace kiln::ops {
namespace {

constexpr int kNumOps = static_cast<int>(Op::kCount);
constexpr int kNoOverride = -1;

struct Parsed {
  std::optional<Backend> all;
  std::array<int, kNumOps> per_op{};  // kNoOverride or a Backend
};

// The items of `spec` as written (no default applied).
Parsed parse_items(const std::string& spec) {
  Parsed parsed;
  parsed.per_op.fill(kNoOverride);
  std::stringstream in(spec);
  std::string item;
  bool first = true;
  bool any = false;
  while (std::getline(in, item, ',')) {
    any = true;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      if (!first) throw std::invalid_argument("kernels: only the first item may be a bare backend, got '" + item + "'");
      parsed.all = parse_backend(item);
    } else {
      const std::string name = item.substr(0, eq);
      int op = kNumOps;
      for (int i = 0; i < kNumOps; ++i) {
        if (op_name(static_cast<Op>(i)) == name) op = i;
      }
      if (op == kNumOps) {
        throw std::invalid_argument("kernels: unknown op '" + name +
                                    "' (rmsnorm, rope, swiglu, linear_ce, attention, linear)");
      }
      parsed.per_op[op] = static_cast<int>(parse_backend(item.substr(eq + 1)));
    }
    first = false;
  }
  if (!any) throw std::invalid_argument("kernels: empty backend spec");
  return parsed;
}

// kDefaultKernels, parsed once (it has a bare first item).
const Parsed& default_spec() {
  static const Parsed parsed = parse_items(kDefaultKernels);
  return parsed;
}

// A spec without a bare item applies on top of the default: its backend, and its overrides for
// the ops the spec does not name.
Parsed parse_spec(const std::string& spec) {
  Parsed parsed = parse_items(spec);
  if (!parsed.all) {
    const Parsed& d = default_spec();
    parsed.all = d.all;
    for (int i = 0; i < kNumOps; ++i) {
      if (parsed.per_op[i] == kNoOverride) parsed.per_op[i] = d.per_op[i];
    }
  }
  return parsed;
}

// The process-wide setting, kDefaultKernels' at start.
struct ProcessSetting {
  std::atomic<Backend> all;
  std::array<std::atomic<int>, kNumOps> op;
  ProcessSetting() {
    const Parsed& d = default_spec();
    all.store(d.all.value_or(Backend::kKiln));
    for (int i = 0; i < kNumOps; ++i) op[i].store(d.per_op[i]);
  }
};
ProcessSetting g_setting;
std::atomic<Backend>& g_backend = g_setting.all;
std::array<std::atomic<int>, kNumOps>& g_override = g_setting.op;

std::string spec_of(Backend all, const std::array<int, kNumOps>& per_op) {
  std::string spec = backend_name(all);
  for (int i = 0; i < kNumOps; ++i) {
    if (per_op[i] != kNoOverride)
      spec += "," + op_name(static_cast<Op>(i)) + "=" + backend_name(static_cast<Backend>(per_op[i]));
  }
  return spec;
}

}  // namespace

// One thread's innermost scope: every op's backend, resolved.
struct BackendScope::State {
  std::array<Backend, kNumOps> op{};
  std::string spec;
};

namespace {
thread_local const BackendScope::State* t_scope = nullptr;
}  // namespace

BackendScope::BackendScope(const std::string& spec) : previous_(t_scope), state_(std::make_unique<State>()) {
  const Parsed parsed = parse_spec(spec);
  for (int i = 0; i < kNumOps; ++i) {
    state_->op[i] =
        parsed.per_op[i] != kNoOverride ? static_cast<Backend>(parsed.per_op[i]) : parsed.all.value_or(Backend::kKiln);
  }
  state_->spec = spec;
  t_scope = state_.get();
}

BackendScope::~BackendScope() {
  t_scope = previous_;
}

std::string effective_backends_spec() {
  return t_scope ? t_scope->spec : backends_spec();
}

void set_backend(Backend b) {
  g_backend.store(b);
  for (auto& o : g_override) o.store(kNoOverride);
}
Backend backend() {
  return g_backend.load();
}
void set_backend(Op op, Backend b) {
  g_override[static_cast<int>(op)].store(static_cast<int>(b));
}
Backend backend(Op op) {
  if (t_scope) return t_scope->op[static_cast<int>(op)];
  const int o = g_override[static_cast<int>(op)].load();
  return o == kNoOverride ? g_backend.load() : static_cast<Backend>(o);
}

std::string backend_name(Backend b) {
  return b == Backend::kKiln ? "kiln" : "aten";
}

Backend parse_backend(const std::string& name) {
  if (name == "kiln") return Backend::kKiln;
  if (name == "aten") return Backend::kAten;
  throw std::invalid_argument("kernel backend must be 'kiln' or 'aten', got '" + name + "'");
}

std::string op_name(Op op) {
  switch (op) {
    case Op::kRmsNorm:
      return "rmsnorm";
    case Op::kRope:
      return "rope";
    case Op::kSwiGlu:
      return "swiglu";
    case Op::kLinearCrossEntropy:
      return "linear_ce";
    case Op::kAttention:
      return "attention";
    case Op::kLinear:
      return "linear";
    default:
      return "?";
  }
}

void validate_backends(const std::string& spec) {
  parse_spec(spec);
}

Backend backend_in_spec(const std::string& spec, Op op) {
  const Parsed parsed = parse_spec(spec);
  const int o = parsed.per_op[static_cast<int>(op)];
  return o != kNoOverride ? static_cast<Backend>(o) : parsed.all.value_or(Backend::kKiln);
}

void set_backends(const std::string& spec) {
  const Parsed parsed = parse_spec(spec);
  set_backend(parsed.all.value_or(Backend::kKiln));
  for (int i = 0; i < kNumOps; ++i) {
    if (parsed.per_op[i] != kNoOverride) set_backend(static_cast<Op>(i), static_cast<Backend>(parsed.per_op[i]));
  }
}

std::string backends_spec() {
  std::array<int, kNumOps> per_op{};
  for (int i = 0; i < kNumOps; ++i) per_op[i] = g_override[i].load();
  return spec_of(backend(), per_op);
}

bool kernels_compiled() {
#ifdef KILN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace kiln::ops
