// The component of a kernel at its launch (lib/kiln/profile/counters/kernel_components.h), as CUPTI's launch
// callback reads it, checked on the CPU: a global RecordFunction callback reads the launch site at
// every matmul op of a tiny model's forward and backward (the ops that launch the GEMM kernels on a
// GPU). Reference: the model's structure, every projection and the LM head in forward, in backward
// through its autograd nodes, and in recomputation.
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/record_function.h>
#include <catch2/catch.hpp>

#include "kiln/profile/counters/kernel_components.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/recompute_layers.h"
#include "support.h"

namespace {

std::mutex g_sites_mutex;
std::vector<kiln::profile::LaunchSite> g_sites;

std::unique_ptr<at::ObserverContext> at_matmul(const at::RecordFunction& fn) {
  const std::string_view name = fn.name();
  if (name == "aten::mm" || name == "aten::addmm" || name == "aten::bmm") {
    kiln::profile::LaunchSite site = kiln::profile::current_launch_site();
    const std::lock_guard<std::mutex> lock(g_sites_mutex);
    g_sites.push_back(std::move(site));
  }
  return nullptr;
}

}  // namespace

TEST_CASE("kernel components: each matmul's component at its launch, forward, backward, recomputation", "[profile]") {
  for (const bool checkpoint : {false, true}) {
    INFO((checkpoint ? "recomputation" : "no recomputation"));
    kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
    m->init_weights(3);
    if (checkpoint) kiln::train::set_layer_recomputation(m, true);
    const at::Tensor ids = at::randint(0, 256, {2, 16}, at::kLong);
    {
      const std::lock_guard<std::mutex> lock(g_sites_mutex);
      g_sites.clear();
    }
    kiln::profile::ScopeLog log;
    REQUIRE(log.active());
    kiln::profile::ScopeLog second;  // one listener at a time
    CHECK_FALSE(second.active());
    CHECK(second.scopes().empty());
    const at::CallbackHandle handle =
        at::addGlobalCallback(at::RecordFunctionCallback(at_matmul).scopes({at::RecordScope::FUNCTION}));
    kiln::train::accumulate_gradients(m, {kiln::train::MicroBatch{ids, ids}},
                                      {.total_targets = kiln::train::count_targets(ids)});
    at::removeCallback(handle);
    const std::vector<kiln::ClosedScope> scopes = log.scopes();
    REQUIRE_FALSE(scopes.empty());

    std::set<std::pair<std::string, std::string>> seen;
    size_t unplaced = 0;
    for (const auto& site : g_sites) {
      const auto c = kiln::profile::launch_component(site, scopes);
      if (c.first.empty()) {
        ++unplaced;
        UNSCOPED_INFO("unplaced: scope '" << site.scope << "', node " << site.node_seq);
      } else {
        seen.insert(c);
      }
    }
    std::string all;
    for (const auto& [component, pass] : seen) all += component + " (" + pass + "); ";
    INFO(all);
    REQUIRE(g_sites.size() > 20);
    CHECK(unplaced == 0);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
      CHECK(seen.count({proj, "fwd"}) == 1);
      CHECK(seen.count({proj, "bwd"}) == 1);
      CHECK(seen.count({proj, "recompute"}) == (checkpoint ? 1u : 0u));
    }
    CHECK(seen.count({"LM head + loss", "fwd"}) == 1);
    CHECK(seen.count({"LM head + loss", "bwd"}) == 1);
    for (const auto& [component, pass] : seen) {
      CHECK((pass == "fwd" || pass == "bwd" || pass == "recompute"));
    }
  }
  // The log ended with its scope: later scopes reach no listener.
  CHECK(kiln::ComponentScope::listener().load() == nullptr);
}
