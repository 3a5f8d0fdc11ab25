// tessera.comm.spawn: `world` thread ranks of this process (comm::run_inproc) calling a Python
// function with their communicator, whose collectives move numpy arrays (python/tessera/comm.py
// allocates the results; the functions here take the send and receive buffers). Each rank holds
// the GIL while its Python code runs and releases it while a collective waits.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "tessera/comm/communicator.h"
#include "tessera/comm/errors.h"
#include "tessera/comm/launch.h"
#include "tessera/core/error.h"

namespace tessera::python {
namespace {

using In = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::c_contig, nb::device::cpu>;

// One rank's communicator (the world's or one split from it), valid while its rank runs.
struct Comm {
  comm::Communicator* c = nullptr;
  std::shared_ptr<std::atomic<bool>> alive;
  // Communicators split from the world on this rank, destroyed when the rank's function returns.
  std::shared_ptr<std::vector<std::unique_ptr<comm::Communicator>>> owned;

  comm::Communicator& get() const {
    if (!alive->load())
      throw comm::CommUsageError(
          "this communicator belonged to a tessera.comm.spawn whose rank has returned; use it "
          "inside the function spawn runs");
    return *c;
  }
};

DType dtype_of(const nb::dlpack::dtype& t) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(t.code);
  if (t.lanes == 1) {
    if (code == C::Float && t.bits == 32) return DType::F32;
    if (code == C::Float && t.bits == 64) return DType::F64;
    if (code == C::Float && t.bits == 16) return DType::F16;
    if (code == C::Bfloat && t.bits == 16) return DType::BF16;
    if (code == C::Int && t.bits == 32) return DType::I32;
    if (code == C::Int && t.bits == 64) return DType::I64;
    if (code == C::UInt && t.bits == 16) return DType::U16;
    if (code == C::UInt && t.bits == 8) return DType::U8;
  }
  throw comm::CommUsageError(
      "tessera's collectives take float32, float64, float16, int32, int64, uint16 or uint8 "
      "arrays");
}

// The dtype of `send` and `recv` (the same), checking recv.size() == send.size() * ratio.
DType pair(const In& send, const Out& recv, double ratio, const char* op) {
  const DType t = dtype_of(send.dtype());
  if (dtype_of(recv.dtype()) != t)
    throw comm::CommUsageError(std::string(op) + ": the send and receive arrays differ in dtype");
  if (static_cast<double>(recv.size()) != static_cast<double>(send.size()) * ratio)
    throw comm::CommUsageError(std::string(op) + ": the receive array holds " +
                               std::to_string(recv.size()) + " elements, not " +
                               std::to_string(static_cast<size_t>(send.size() * ratio)));
  return t;
}

comm::ReduceOp op_of(const std::string& s) {
  if (s == "sum") return comm::ReduceOp::Sum;
  if (s == "mean") return comm::ReduceOp::Mean;
  if (s == "max") return comm::ReduceOp::Max;
  if (s == "min") return comm::ReduceOp::Min;
  throw comm::CommUsageError("op '" + s + "': expected sum, mean, max or min");
}

void all_reduce(const Comm& w, In send, Out recv, const std::string& op) {
  const DType t = pair(send, recv, 1, "all_reduce");
  comm::AllReduceOptions o;
  o.op = op_of(op);
  nb::gil_scoped_release unlocked;
  w.get().all_reduce(send.data(), recv.data(), send.size(), t, o).wait();
}

void all_gather(const Comm& w, In send, Out recv) {
  const DType t = pair(send, recv, w.get().size(), "all_gather");
  nb::gil_scoped_release unlocked;
  w.get().all_gather(send.data(), recv.data(), send.size(), t).wait();
}

void reduce_scatter(const Comm& w, In send, Out recv, const std::string& op) {
  const DType t = pair(send, recv, 1.0 / w.get().size(), "reduce_scatter");
  comm::ReduceScatterOptions o;
  o.op = op_of(op);
  nb::gil_scoped_release unlocked;
  w.get().reduce_scatter(send.data(), recv.data(), recv.size(), t, o).wait();
}

void broadcast(const Comm& w, Out buf, int root) {
  const DType t = dtype_of(buf.dtype());
  comm::BroadcastOptions o;
  o.root = root;
  nb::gil_scoped_release unlocked;
  w.get().broadcast(buf.data(), buf.size(), t, o).wait();
}

void all_to_all(const Comm& w, In send, Out recv) {
  const DType t = pair(send, recv, 1, "all_to_all");
  const size_t n = static_cast<size_t>(w.get().size());
  if (send.size() % n != 0)
    throw comm::CommUsageError("all_to_all: " + std::to_string(send.size()) +
                               " elements do not split into " + std::to_string(n) +
                               " equal blocks");
  nb::gil_scoped_release unlocked;
  w.get().all_to_all(send.data(), recv.data(), send.size() / n, t).wait();
}

void send(const Comm& w, In buf, int peer, int tag) {
  const DType t = dtype_of(buf.dtype());
  comm::SendOptions o;
  o.tag = tag;
  nb::gil_scoped_release unlocked;
  w.get().send(buf.data(), buf.size(), t, peer, o).wait();
}

void recv(const Comm& w, Out buf, int peer, int tag) {
  const DType t = dtype_of(buf.dtype());
  comm::RecvOptions o;
  o.tag = tag;
  nb::gil_scoped_release unlocked;
  w.get().recv(buf.data(), buf.size(), t, peer, o).wait();
}

void barrier(const Comm& w) {
  nb::gil_scoped_release unlocked;
  w.get().barrier().wait();
}

// None when color < 0 (this rank joins no group).
nb::object split(const Comm& w, int color, int key) {
  std::unique_ptr<comm::Communicator> child;
  {
    nb::gil_scoped_release unlocked;
    child = w.get().split(color, key);
  }
  if (!child) return nb::none();
  Comm c{child.get(), w.alive, w.owned};
  w.owned->push_back(std::move(child));
  return nb::cast(std::move(c));
}

comm::Timeout timeout_of(double seconds) {
  return comm::Timeout(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

nb::list spawn(nb::callable fn, int world, double timeout_s) {
  if (world < 1) throw comm::CommUsageError("spawn: world must be at least 1");
  comm::CommOptions o;
  if (timeout_s > 0) o.timeout = timeout_of(timeout_s);
  std::vector<nb::object> results(static_cast<size_t>(world));
  {
    nb::gil_scoped_release unlocked;
    comm::run_inproc(
        world,
        [&](comm::Communicator& c) {
          Comm w{&c, std::make_shared<std::atomic<bool>>(true),
                 std::make_shared<std::vector<std::unique_ptr<comm::Communicator>>>()};
          struct End {  // whatever fn did, its communicators end with the rank
            Comm& w;
            ~End() {
              w.alive->store(false);
              w.owned->clear();
            }
          } end{w};
          nb::gil_scoped_acquire locked;
          nb::object r = fn(nb::cast(w));
          results[static_cast<size_t>(c.rank())] = std::move(r);
        },
        o);
  }
  nb::list out;
  for (nb::object& r : results) out.append(r);
  return out;
}

}  // namespace

void register_comm(nb::module_& m) {
  nb::class_<Comm>(m, "_Comm")
      .def_prop_ro("rank", [](const Comm& w) { return w.get().rank(); })
      .def_prop_ro("size", [](const Comm& w) { return w.get().size(); })
      .def_prop_ro("name", [](const Comm& w) { return w.get().name(); })
      .def("all_reduce", &all_reduce, nb::arg("send"), nb::arg("recv").noconvert(), nb::arg("op"))
      .def("all_gather", &all_gather, nb::arg("send"), nb::arg("recv").noconvert())
      .def("reduce_scatter", &reduce_scatter, nb::arg("send"), nb::arg("recv").noconvert(),
           nb::arg("op"))
      .def("broadcast", &broadcast, nb::arg("buf").noconvert(), nb::arg("root"))
      .def("all_to_all", &all_to_all, nb::arg("send"), nb::arg("recv").noconvert())
      .def("send", &send, nb::arg("buf"), nb::arg("peer"), nb::arg("tag"))
      .def("recv", &recv, nb::arg("buf").noconvert(), nb::arg("peer"), nb::arg("tag"))
      .def("barrier", &barrier)
      .def("split", &split, nb::arg("color"), nb::arg("key"));
  m.def("_spawn", &spawn, nb::arg("fn"), nb::arg("world"), nb::arg("timeout"));
}

}  // namespace tessera::python
