// kiln-profile's subcommands as one library call: the settings read (settings.h), the sweep run or
// the models priced, the Markdown (or JSON) on stdout and every file written named on stderr.
// apps/kiln_profile.cpp is its command line.
#pragma once

#include <string>

#include "kiln/profile/settings.h"

namespace kiln::profile {

// Runs `command` with the YAML file `config_path` (sweep only; "" = none) and the command line's
// overrides. Launched by torchrun or srun, a sweep runs on every rank and rank 0 reports. Errors
// throw (config::ConfigError naming the source and the key).
void run_command(Command command, const std::string& config_path, const Overrides& overrides);

}  // namespace kiln::profile
