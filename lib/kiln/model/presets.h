// The model presets of configs/models/*.yaml, compiled into the library by CMake
// (lib/presets.cpp.in), so that preset names resolve without a source tree at run time.
#pragma once

#include <string_view>
#include <utility>
#include <vector>

namespace kiln::model::detail {

// (name, YAML text) for every configs/models/<name>.yaml, sorted by name.
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_presets();
// (name, YAML text) for every configs/pretrain/<name>.yaml (e.g. "quickstart").
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_pretrain_configs();
// (name, YAML text) for every configs/reference/<name>.yaml: the reference runs' figures
// (llamafactory_runs), the host costs measured for them (host_costs) and their 100M model
// (llama3-100m), read by kiln-profile reference (profile/reference_report.h).
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_reference_files();

}  // namespace kiln::model::detail
