// tessera: the whole public API (docs/API.md). Link tessera::tessera:
//   find_package(tessera 0.1 REQUIRED)
//   target_link_libraries(app PRIVATE tessera::tessera)
#pragma once

#include "tessera/comm.h"
#include "tessera/core.h"
#include "tessera/data.h"
#include "tessera/io.h"
#include "tessera/kernels.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/parallel.h"
#include "tessera/plan.h"
#include "tessera/train.h"
