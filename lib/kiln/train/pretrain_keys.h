// PretrainConfig's key table (config/key_table.h): kiln-pretrain's keys, and the ones other
// settings take from it (kiln-profile's sweep: the optimisation keys), so that a key is read into
// its field in one place. Internal to the library (pulls in yaml-cpp).
#pragma once

#include "kiln/config/key_table.h"
#include "kiln/train/pretrain_config.h"

namespace kiln::train {

const config::KeyTable<PretrainConfig>& pretrain_key_table();

// kiln-pretrain's command-line spelling, as every kiln program's: kebab case (--cutoff-len), the
// table's boolean keys alone for true (--bf16), and the keys it reads (the table's and
// LLaMA-Factory's, hf/lf_keys.h), so that a misspelled flag is refused as an unknown key.
// parse_overrides uses it; a program adds its own flags (kiln-pretrain's dry_run, dump_data).
config::Spelling pretrain_spelling();

}  // namespace kiln::train
