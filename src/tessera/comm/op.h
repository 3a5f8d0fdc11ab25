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
  SendRecv,
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
  int root = -1;  // Broadcast: the root (and nothing else)
  int peer = -1;  // Send: the destination; Recv: the source; SendRecv: the peer sent to (-1: none)
  int tag = 0;    // Send/Recv; SendRecv: the tag of the message sent
  // SendRecv: the receiving half (the sending half is send, count, peer and tag).
  size_t recv_count = 0;
  int recv_peer = -1;  // -1: no receive
  int recv_tag = 0;
  Algorithm algorithm = Algorithm::Auto;
  std::vector<size_t> send_counts, recv_counts;  // AllToAllV: elements per peer, packed
  Timeout timeout{0};                            // resolved (never kDefaultTimeout)
  uint64_t seq = 0;                              // collective sequence number in this comm, from 1
  int color = 0, key = 0;                        // Split

  // "all_reduce #5 (F32 x 1000, sum)"; "send_recv (F32 x 4 to rank 1 tag 0, F32 x 4 from rank 3
  // tag 0)".
  std::string describe() const;
};

// The prefix of every error message about one operation, built here and nowhere else:
// "all_reduce #2 (F32 x 1048576, sum) on communicator 'world' rank 0/3".
std::string op_context(const OpDesc& d, std::string_view comm_name, int rank, int size);
// The same for an operation named by `what` alone ("split #3").
std::string op_context(std::string_view what, std::string_view comm_name, int rank, int size);

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
// names the communicator and which ranks called what ("collective mismatch on communicator 'world'
// rank 0/3: ranks 0,2 called all_reduce #1 (F32 x 2, sum); rank 1 called all_gather #1 (F32 x
// 1)"); only the rank in it differs between ranks.
void check_fingerprints(const std::vector<Fingerprint>& fps, const std::string& comm_name,
                        int my_rank);
// The same for some of the ranks of a communicator of `comm_size`: fps[i] is rank ranks[i]'s.
void check_fingerprints(const std::vector<Fingerprint>& fps, const std::vector<int>& ranks,
                        const std::string& comm_name, int my_rank, int comm_size);

// Whether all_reduce and reduce_scatter accept elements of this dtype (F32, F64, BF16, I32, I64;
// every reduce op applies to each of them).
bool reduction_supported(DType t);

}  // namespace tessera::comm::detail
