// tessera/optim.h: the public API of the optim layer (docs/API.md).
// Optimizers over segments (AdamW, SGD), gradient-norm clipping, the learning-rate schedule.
#pragma once

#include "tessera/optim/adamw.h"
#include "tessera/optim/grad_clip.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/optim/optimizer.h"
#include "tessera/optim/sgd.h"
