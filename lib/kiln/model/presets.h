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

}  // namespace kiln::model::detail
