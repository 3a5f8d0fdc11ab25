// The frontend's description of a call (comm/op.h): the peer of point-to-point calls apart from
// the broadcast root, as error messages, fingerprints and fault injection see them.
#include "tessera/comm/op.h"

#include <gtest/gtest.h>

#include "tessera/comm/fault.h"

namespace tessera::comm::test {
namespace {

using detail::OpDesc;
using detail::OpType;

OpDesc desc(OpType type, size_t count) {
  OpDesc d;
  d.type = type;
  d.count = count;
  return d;
}

TEST(OpDesc, PointToPointNamesThePeerNotTheRoot) {
  OpDesc s = desc(OpType::Send, 4);
  s.peer = 2;
  s.tag = 1;
  s.root = 5;  // not a broadcast: ignored
  EXPECT_EQ(s.describe(), "send (F32 x 4, tag 1, to rank 2)");
  OpDesc r = desc(OpType::Recv, 3);
  r.peer = 1;
  EXPECT_EQ(r.describe(), "recv (F32 x 3, tag 0, from rank 1)");
  OpDesc x = desc(OpType::SendRecv, 4);
  x.peer = 1;
  x.tag = 2;
  x.recv_count = 6;
  x.recv_peer = 3;
  x.recv_tag = 7;
  x.root = 0;
  EXPECT_EQ(x.describe(), "send_recv (F32 x 4 to rank 1 tag 2, F32 x 6 from rank 3 tag 7)");
  x.peer = -1;
  EXPECT_EQ(x.describe(), "send_recv (F32 x 6 from rank 3 tag 7)");
  x.recv_peer = -1;
  EXPECT_EQ(x.describe(), "send_recv (nothing)");
}

TEST(OpDesc, FingerprintsCarryTheBroadcastRootOnly) {
  OpDesc b = desc(OpType::Broadcast, 4);
  b.seq = 3;
  b.root = 2;
  b.peer = 1;
  EXPECT_EQ(detail::fingerprint_of(b).root, 2);
  EXPECT_EQ(b.describe(), "broadcast #3 (F32 x 4, root 2)");
  OpDesc a = desc(OpType::AllReduce, 4);
  a.seq = 3;
  a.root = 2;  // meaningless for an all-reduce: not compared
  a.peer = 1;
  EXPECT_EQ(detail::fingerprint_of(a).root, -1);
  EXPECT_EQ(a.describe(), "all_reduce #3 (F32 x 4, sum)");
}

TEST(OpDesc, MismatchFaultShortensTheHalfThatIsSent) {
  OpDesc x = desc(OpType::SendRecv, 4);
  x.recv_count = 6;
  x.recv_peer = 0;
  x.peer = -1;  // receive only: the receive is shortened
  x.root = 3;   // ignored
  detail::make_mismatched(x);
  EXPECT_EQ(x.count, 4u);
  EXPECT_EQ(x.recv_count, 5u);
  x.peer = 1;  // sends: the message is shortened
  detail::make_mismatched(x);
  EXPECT_EQ(x.count, 3u);
  EXPECT_EQ(x.recv_count, 5u);
  OpDesc barrier = desc(OpType::Barrier, 0);
  detail::make_mismatched(barrier);
  EXPECT_EQ(barrier.type, OpType::Broadcast);
  EXPECT_EQ(barrier.root, 0);
}

}  // namespace
}  // namespace tessera::comm::test
