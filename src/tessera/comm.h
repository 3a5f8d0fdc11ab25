// tessera/comm.h: the public API of the comm layer (docs/API.md).
// The Communicator (collectives and point-to-point, Work handles, options, typed errors) and how
// ranks start: run_inproc (threads) and mpi_world (processes).
#pragma once

#include "tessera/comm/bench.h"
#include "tessera/comm/communicator.h"
#include "tessera/comm/errors.h"
#include "tessera/comm/fault.h"
#include "tessera/comm/launch.h"
#include "tessera/comm/options.h"
#include "tessera/comm/wire.h"
#include "tessera/comm/work.h"
