// tessera/io.h: the public API of the io layer (docs/API.md).
// safetensors, Hugging Face config.json, layout-free checkpoints, atomic files, checksums.
#pragma once

#include "tessera/io/atomic_file.h"
#include "tessera/io/checkpoint.h"
#include "tessera/io/checksum.h"
#include "tessera/io/hf_config.h"
#include "tessera/io/safetensors.h"
#include "tessera/io/tensor_set.h"
