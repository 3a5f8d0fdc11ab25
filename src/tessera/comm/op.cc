#include "tessera/comm/op.h"

#include <map>
#include <sstream>

#include "tessera/comm/errors.h"

namespace tessera::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Mean:
      return "mean";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::Auto:
      return "auto";
    case Algorithm::Small:
      return "small";
    case Algorithm::Direct:
      return "direct";
    case Algorithm::Ring:
      return "ring";
  }
  return "?";
}

namespace detail {

std::string_view op_name(OpType t) {
  switch (t) {
    case OpType::AllReduce:
      return "all_reduce";
    case OpType::AllGather:
      return "all_gather";
    case OpType::ReduceScatter:
      return "reduce_scatter";
    case OpType::Broadcast:
      return "broadcast";
    case OpType::AllToAll:
      return "all_to_all";
    case OpType::AllToAllV:
      return "all_to_allv";
    case OpType::Send:
      return "send";
    case OpType::Recv:
      return "recv";
    case OpType::SendRecv:
      return "send_recv";
    case OpType::Barrier:
      return "barrier";
    case OpType::Split:
      return "split";
  }
  return "?";
}

bool is_collective(OpType t) {
  return t != OpType::Send && t != OpType::Recv && t != OpType::SendRecv;
}

bool reduction_supported(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::I32 ||
         t == DType::I64;
}

Fingerprint fingerprint_of(const OpDesc& d) {
  Fingerprint f;
  f.seq = d.seq;
  f.type = static_cast<int32_t>(d.type);
  f.dtype = static_cast<int32_t>(d.dtype);
  f.count = d.type == OpType::AllToAllV ? 0 : d.count;
  f.root = d.type == OpType::Broadcast ? d.root : -1;
  f.op = (d.type == OpType::AllReduce || d.type == OpType::ReduceScatter)
             ? static_cast<int32_t>(d.op)
             : -1;
  return f;
}

std::string fingerprint_str(const Fingerprint& f) {
  std::ostringstream os;
  auto type = static_cast<OpType>(f.type);
  os << op_name(type) << " #" << f.seq;
  if (type == OpType::Barrier || type == OpType::Split) return os.str();
  os << " (" << dtype_name(static_cast<DType>(f.dtype));
  if (type != OpType::AllToAllV) os << " x " << f.count;
  if (f.op >= 0) os << ", " << reduce_op_name(static_cast<ReduceOp>(f.op));
  if (f.root >= 0) os << ", root " << f.root;
  os << ")";
  return os.str();
}

std::string OpDesc::describe() const {
  if (type == OpType::Send || type == OpType::Recv) {
    std::ostringstream os;
    os << op_name(type) << " (" << dtype_name(dtype) << " x " << count << ", tag " << tag
       << (type == OpType::Send ? ", to rank " : ", from rank ") << peer << ")";
    return os.str();
  }
  if (type == OpType::SendRecv) {
    std::ostringstream os;
    os << op_name(type) << " (";
    if (peer >= 0)
      os << dtype_name(dtype) << " x " << count << " to rank " << peer << " tag " << tag;
    if (peer >= 0 && recv_peer >= 0) os << ", ";
    if (recv_peer >= 0)
      os << dtype_name(dtype) << " x " << recv_count << " from rank " << recv_peer << " tag "
         << recv_tag;
    if (peer < 0 && recv_peer < 0) os << "nothing";
    os << ")";
    return os.str();
  }
  return fingerprint_str(fingerprint_of(*this));
}

std::string op_context(std::string_view what, std::string_view comm_name, int rank, int size) {
  return concat(what, " on communicator '", comm_name, "' rank ", rank, "/", size);
}

std::string op_context(const OpDesc& d, std::string_view comm_name, int rank, int size) {
  return op_context(d.describe(), comm_name, rank, size);
}

static std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ranks[i]);
  }
  return s;
}

void check_fingerprints(const std::vector<Fingerprint>& fps, const std::string& comm_name,
                        int my_rank) {
  std::vector<int> ranks(fps.size());
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int>(r);
  check_fingerprints(fps, ranks, comm_name, my_rank, static_cast<int>(fps.size()));
}

void check_fingerprints(const std::vector<Fingerprint>& fps, const std::vector<int>& ranks,
                        const std::string& comm_name, int my_rank, int comm_size) {
  bool same = true;
  for (const auto& f : fps) same = same && f == fps[0];
  if (same) return;
  // Group ranks by what they called, in order of first appearance.
  std::vector<std::pair<Fingerprint, std::vector<int>>> groups;
  for (size_t i = 0; i < fps.size(); ++i) {
    bool found = false;
    for (auto& g : groups)
      if (g.first == fps[i]) {
        g.second.push_back(ranks[i]);
        found = true;
      }
    if (!found) groups.push_back({fps[i], {ranks[i]}});
  }
  std::ostringstream os;
  os << op_context("collective mismatch", comm_name, my_rank, comm_size) << ": ";
  for (size_t i = 0; i < groups.size(); ++i)
    os << (i ? "; " : "") << rank_list(groups[i].second) << " called "
       << fingerprint_str(groups[i].first);
  throw MismatchError(os.str());
}

}  // namespace detail
}  // namespace tessera::comm
