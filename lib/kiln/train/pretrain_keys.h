// PretrainConfig's key table (config/key_table.h): kiln-pretrain's keys, and the ones other
// settings take from it (kiln-profile's sweep: the optimisation keys), so that a key is read into
// its field in one place. Internal to the library (pulls in yaml-cpp).
#pragma once

#include "kiln/config/key_table.h"
#include "kiln/train/pretrain_config.h"

namespace kiln::train {

const config::KeyTable<PretrainConfig>& pretrain_key_table();

}  // namespace kiln::train
