// tessera/data.h: the public API of the data layer (docs/API.md).
// Byte-level BPE tokenizer, token files and sources, corpus resolution and caching, the
// deterministic sampler, evaluation windows.
#pragma once

#include "tessera/data/bpe_tokenizer.h"
#include "tessera/data/bpe_tokenizer_adapter.h"
#include "tessera/data/corpus.h"
#include "tessera/data/dataset.h"
#include "tessera/data/eval_windows.h"
#include "tessera/data/load_tokenizer.h"
#include "tessera/data/prepare.h"
#include "tessera/data/sampler.h"
#include "tessera/data/token_file.h"
#include "tessera/data/token_source.h"
#include "tessera/data/tokenizer.h"
