// Typed errors of the communication layer. Every message names the operation, the communicator and
// the ranks involved, so that a failure on one rank of many can be diagnosed from its log alone.
#pragma once

#include "tessera/core/error.h"

namespace tessera::comm {

namespace detail {
using ::tessera::detail::concat;
}

// Base of every error a Communicator raises.
class CommError : public Error {
 public:
  using Error::Error;
};

// A wait passed its deadline: the message names the op, its sequence number and the peers that
// had not arrived.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// Ranks called different collectives, or the same collective with different dtype, count, root or
// reduce op. Every rank of the group raises it; the message names the op and the disagreeing ranks.
class MismatchError : public CommError {
 public:
  using CommError::CommError;
};

// Another rank failed (threw, timed out, or exited) while this rank waited for it, or this
// communicator is unusable because an earlier operation failed.
class PeerFailedError : public CommError {
 public:
  using CommError::CommError;
};

// Invalid arguments: a root or peer out of range, an unsupported dtype for a reduction, ...
class CommUsageError : public CommError {
 public:
  using CommError::CommError;
};

}  // namespace tessera::comm
