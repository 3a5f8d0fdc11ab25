// Internal: the description of one communication call as the frontend hands it to a backend, and
// the fingerprint the ranks compare to detect mismatched collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/comm/options.h"
#include "tessera/core/dtype.h"

namespace tessera::comm::detail {

enum class OpType : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  Broadcast,
  AllToAll,
  AllToAllV,
  Send,
  Recv,
  Barrier,
  Split,
};
std::string_view op_name(OpType t);
bool is_collective(OpType t);

struct OpDesc {
  OpType type = OpType::Barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  // AllReduce, Broadcast, Send, Recv: elements in the buffer. AllGather, ReduceScatter, AllToAll:
  // elements per rank (the size of the smaller buffer / of one block).
  size_t count = 0;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  int root = -1;  // Broadcast root; Send/Recv peer
  int tag = 0;
  Algorithm algorithm = Algorithm::Auto;
  std::vector<size_t> send_counts, recv_counts;  // AllToAllV: elements per peer, packed
  Timeout timeout{0};                            // resolved (never kDefaultTimeout)
  uint64_t seq = 0;                              // collective sequence number in this comm, from 1
  int color = 0, key = 0;                        // Split

  // "all_reduce #5 (F32 x 1000, sum)"
  std::string describe() const;
};

// What ranks compare in debug mode (and always, on the inproc backend).
struct Fingerprint {
  uint64_t seq = 0;
  uint64_t count = 0;
  int32_t type = 0;
  int32_t dtype = 0;
  int32_t root = 0;
  int32_t op = 0;
  bool operator==(const Fingerprint&) const = default;
};
Fingerprint fingerprint_of(const OpDesc& d);
std::string fingerprint_str(const Fingerprint& f);  // "all_reduce #5 (F32 x 1000, sum)"

// Throws MismatchError when the fingerprints of the ranks differ. `fps[r]` is rank r's. The message
// names the op, the communicator and which ranks called what; every rank computes the same text.
void check_fingerprints(const std::vector<Fingerprint>& fps, const std::string& comm_name,
                        int my_rank);

// Elements of `count` bytes for a reduce op / dtype pair that a reduction supports.
bool reduction_supported(DType t);

}  // namespace tessera::comm::detail
