// The flight recorder (comm/flight_recorder.h): the ring (wrap-around, states, threads), its dump
// (format and round trip), the hooks in the Communicator (every call recorded with its
// communicator and sequence number; failures and injected faults dump), and the doctor's
// diagnoses (comm/flight_doctor.h) on real dumps of faulty runs and on made-up ones.
#include "tessera/comm/flight_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "helpers.h"
#include "tessera/comm/fault.h"
#include "tessera/comm/flight_doctor.h"

namespace tessera::comm::test {
namespace {

using namespace std::chrono_literals;
using detail::OpDesc;
using detail::OpType;
using nlohmann::json;
namespace fs = std::filesystem;

OpDesc all_reduce_desc(uint64_t seq, size_t count) {
  OpDesc d;
  d.type = OpType::AllReduce;
  d.count = count;
  d.seq = seq;
  return d;
}

// A fresh directory under the test's temporary directory, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() /
           (name + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST(FlightRecorder, KeepsTheLastCallsOldestFirstWhenTheRingWraps) {
  FlightRecorder r(0, 2, 4, "");
  const uint16_t c = r.add_communicator("world", 0, 2);
  std::vector<uint64_t> ids;
  for (uint64_t s = 1; s <= 10; ++s)
    ids.push_back(r.issued(c, all_reduce_desc(s, s), s, false, true));
  EXPECT_EQ(r.issued_total(), 10u);
  const std::vector<CallRecord> recs = r.records();
  ASSERT_EQ(recs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(recs[i].id, 7 + i);
    EXPECT_EQ(recs[i].seq, 7 + i);
    EXPECT_EQ(recs[i].count, 7 + i);
    EXPECT_EQ(recs[i].bytes, (7 + i) * 4);
  }
  // A call whose record was overwritten: its end changes nothing.
  r.ended(ids[0], true);
  for (const CallRecord& x : r.records()) EXPECT_EQ(x.state, CallState::Started);
  // Fewer calls than the capacity: all of them.
  FlightRecorder few(0, 2, 8, "");
  (void)few.issued(0, all_reduce_desc(1, 1), 1, false, true);
  EXPECT_EQ(few.records().size(), 1u);
}

TEST(FlightRecorder, FollowsACallThroughItsStates) {
  FlightRecorder r(1, 2, 16, "");
  const uint16_t c = r.add_communicator("dp[0,1]", 1, 2);
  EXPECT_EQ(r.add_communicator("dp[0,1]", 1, 2), c);  // registered once
  const uint64_t a = r.issued(c, all_reduce_desc(1, 8), 1, true, false);
  const uint64_t b = r.issued(c, all_reduce_desc(2, 8), 2, true, false);
  auto state = [&](uint64_t id) {
    for (const CallRecord& x : r.records())
      if (x.id == id) return x;
    ADD_FAILURE() << "no record " << id;
    return CallRecord{};
  };
  EXPECT_EQ(state(a).state, CallState::Queued);
  EXPECT_EQ(state(a).started_ns, -1);
  EXPECT_TRUE(state(a).async);
  r.started(a);
  EXPECT_EQ(state(a).state, CallState::Started);
  EXPECT_GE(state(a).started_ns, state(a).queued_ns);
  r.ended(a, true);
  r.ended(b, false);  // failed before it started: started is its end
  EXPECT_EQ(state(a).state, CallState::Completed);
  EXPECT_GE(state(a).ended_ns, state(a).started_ns);
  EXPECT_EQ(state(b).state, CallState::Failed);
  EXPECT_EQ(state(b).started_ns, state(b).ended_ns);
}

TEST(FlightRecorder, IsSafeFromManyThreads) {
  FlightRecorder r(0, 4, 256, "");
  constexpr int kThreads = 4, kCalls = 2000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      const uint16_t c = r.add_communicator("c" + std::to_string(t), 0, 2);
      for (int i = 1; i <= kCalls; ++i) {
        const uint64_t id = r.issued(c, all_reduce_desc(i, 1), i, true, false);
        r.started(id);
        r.add_wait(1ns);
        r.ended(id, true);
        if (i % 500 == 0) (void)r.to_json("request", "");
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(r.issued_total(), uint64_t{kThreads * kCalls});
  const std::vector<CallRecord> recs = r.records();
  ASSERT_EQ(recs.size(), 256u);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].id, kThreads * kCalls - 255 + i);
    EXPECT_EQ(recs[i].state, CallState::Completed);
  }
  EXPECT_NEAR(r.wait_seconds(), kThreads * kCalls * 1e-9, 1e-12);
}

TEST(FlightRecorder, DumpsAtomicallyAndRoundTrips) {
  TempDir dir("tessera-fr-dump");
  FlightRecorder r(3, 4, 8, dir.path.string());
  const uint16_t c = r.add_communicator("tp[2,3]", 1, 2);
  OpDesc b;
  b.type = OpType::Broadcast;
  b.count = 5;
  b.dtype = DType::I64;
  b.root = 1;
  b.seq = 1;
  r.ended(r.issued(c, b, 1, false, true), true);
  OpDesc s;
  s.type = OpType::Send;
  s.count = 3;
  s.peer = 0;
  s.tag = 7;
  (void)r.issued(c, s, 2, true, false);
  r.note_failure("timeout", "first");
  const std::string path = r.dump("timeout", "all_reduce #2 timed out");
  EXPECT_EQ(path, (dir.path / "rank-3.json").string());
  EXPECT_EQ(r.dump("timeout", "again"), "") << "nothing changed: not written again";
  std::ifstream in(path);
  const json j = json::parse(in);
  EXPECT_EQ(j["format"], "tessera-flight-recorder");
  EXPECT_EQ(j["version"], kFlightRecorderVersion);
  EXPECT_EQ(j["world_rank"], 3);
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["pid"], ::getpid());
  EXPECT_FALSE(j["host"].get<std::string>().empty());
  EXPECT_EQ(j["reason"], "timeout");
  EXPECT_EQ(j["error"], "all_reduce #2 timed out");
  EXPECT_EQ(j["first_failure"]["error"], "first");
  EXPECT_GT(j["anchor_wall_ns"].get<int64_t>(), 0);
  EXPECT_EQ(j["communicators"][0]["name"], "tp[2,3]");
  ASSERT_EQ(j["records"].size(), 2u);
  const json& x = j["records"][0];
  EXPECT_EQ(x["op"], "broadcast");
  EXPECT_EQ(x["comm"], "tp[2,3]");
  EXPECT_EQ(x["seq"], 1);
  EXPECT_EQ(x["dtype"], "I64");
  EXPECT_EQ(x["count"], 5);
  EXPECT_EQ(x["bytes"], 40);
  EXPECT_EQ(x["root"], 1);
  EXPECT_EQ(x["state"], "completed");
  const json& y = j["records"][1];
  EXPECT_EQ(y["op"], "send");
  EXPECT_EQ(y["seq"], 0);
  EXPECT_EQ(y["peer"], 0);
  EXPECT_EQ(y["tag"], 7);
  EXPECT_EQ(y["state"], "queued");
  EXPECT_EQ(y["ended_ns"], -1);
  // No temporary file is left next to it.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1);
  // The doctor reads it back.
  const std::vector<json> dumps = read_flight_dumps(dir.path.string());
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0], j);
}

TEST(FlightRecorder, RecordsEveryCallOfEveryCommunicatorOfARank) {
  CommOptions o;
  o.flight_recorder_entries = 64;
  std::vector<std::vector<CallRecord>> recs(2);
  std::vector<std::string> comms(2);
  spawn(
      2,
      [&](Communicator& c) {
        float x[4] = {1, 2, 3, 4};
        c.all_reduce(x, 4, DType::F32).wait();
        std::unique_ptr<Communicator> sub = c.split(0, c.rank(), "pair");
        AllReduceOptions async;
        async.async = true;
        Work w = sub->all_reduce(x, 4, DType::F32, async);
        w.wait();
        if (c.rank() == 0)
          sub->send(x, 2, DType::F32, 1).wait();
        else
          sub->recv(x, 2, DType::F32, 0).wait();
        c.barrier().wait();
        recs[static_cast<size_t>(c.rank())] = c.flight_recorder()->records();
        EXPECT_EQ(sub->flight_recorder(), c.flight_recorder()) << "one recorder per rank";
        comms[static_cast<size_t>(c.rank())] =
            c.flight_recorder()->to_json("request", "")["communicators"].dump();
      },
      o);
  for (int r = 0; r < 2; ++r) {
    const auto& v = recs[static_cast<size_t>(r)];
    ASSERT_EQ(v.size(), 5u) << "all_reduce, split, all_reduce, send or recv, barrier";
    EXPECT_EQ(v[0].op, OpType::AllReduce);
    EXPECT_EQ(v[0].seq, 1u);
    EXPECT_EQ(v[1].op, OpType::Split);
    EXPECT_EQ(v[1].seq, 2u);
    EXPECT_EQ(v[2].op, OpType::AllReduce);
    EXPECT_EQ(v[2].seq, 1u) << "its own communicator's numbering";
    EXPECT_TRUE(v[2].async);
    EXPECT_EQ(v[3].op, r == 0 ? OpType::Send : OpType::Recv);
    EXPECT_EQ(v[3].seq, 0u);
    EXPECT_EQ(v[3].call, 2u);
    EXPECT_EQ(v[4].op, OpType::Barrier);
    EXPECT_EQ(v[4].seq, 3u);
    EXPECT_NE(v[0].comm, v[2].comm);
    for (const CallRecord& x : v) {
      EXPECT_EQ(x.state, CallState::Completed);
      EXPECT_GE(x.ended_ns, x.started_ns);
      EXPECT_GE(x.started_ns, x.queued_ns);
    }
    EXPECT_NE(comms[static_cast<size_t>(r)].find("\"pair\""), std::string::npos);
  }
}

TEST(FlightRecorder, IsOffWithNoEntries) {
  CommOptions o;
  o.flight_recorder_entries = 0;
  spawn(
      2,
      [&](Communicator& c) {
        c.barrier().wait();
        EXPECT_EQ(c.flight_recorder(), nullptr);
      },
      o);
}

TEST(FaultSkip, ParsesAndSkipsTheCallSoThatThePeersTimeOut) {
  EXPECT_EQ(parse_fault_spec("rank=0,op=1,kind=skip").kind, FaultKind::Skip);
  EXPECT_THROW(parse_fault_spec("rank=0,op=1,kind=skip:2"), ConfigError);
  CommOptions o;
  o.timeout = 200ms;
  o.fault = std::make_shared<const FaultSpec>(parse_fault_spec("rank=1,op=1,kind=skip"));
  std::atomic<bool> skipped_completed{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::exception_ptr> errs = spawn_collect(
      2,
      [&](Communicator& c) {
        float x[2] = {1, 1};
        Work w = c.all_reduce(x, 2, DType::F32);
        if (c.rank() == 1) {
          skipped_completed = w.is_completed() && w.exception() == nullptr && x[0] == 1;
          EXPECT_EQ(c.seq_issued(), 1u) << "the skipped call took its sequence number";
          EXPECT_TRUE(c.flight_recorder()->records().empty()) << "and left no record";
          std::this_thread::sleep_for(400ms);  // stays in the world while its peer waits
          return;
        }
        w.wait();
      },
      o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_TRUE(skipped_completed);
  EXPECT_EQ(errs[1], nullptr);
  EXPECT_NE(what(errs[0]).find("all_reduce #1 (F32 x 2, sum) on communicator 'world' rank 0/2: "
                               "timed out after 200 ms"),
            std::string::npos)
      << what(errs[0]);
}

// A run of `n` thread-ranks with a fault, dumping to `dir`: each rank does `calls` all-reduces.
// `calls_of(rank)` all-reduces on rank `rank` (default: `calls` on every rank).
void faulty_run(int n, const std::string& fault, const fs::path& dir, int calls = 4,
                const std::function<int(int)>& calls_of = nullptr) {
  CommOptions o;
  o.timeout = 300ms;
  o.flight_recorder = dir.string();
  o.fault = std::make_shared<const FaultSpec>(parse_fault_spec(fault));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::exception_ptr> errs = spawn_collect(
      n,
      [&](Communicator& c) {
        float x[8] = {};
        const int mine = calls_of ? calls_of(c.rank()) : calls;
        for (int i = 0; i < mine; ++i) c.all_reduce(x, 8, DType::F32).wait();
        // A rank that stops early stays in the world until its peers have timed out.
        if (mine < calls) std::this_thread::sleep_for(500ms);
      },
      o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  bool failed = false;
  for (auto& e : errs) failed = failed || e != nullptr;
  EXPECT_TRUE(failed) << fault << ": some rank fails";
}

TEST(FlightDoctor, NamesTheRankThatSkippedACall) {
  TempDir dir("tessera-fr-skip");
  // Rank 1 skips its second call and issues no other: a rank that went on to a third all-reduce
  // while its peers still read its slot of the first would race in the inproc backend, whose
  // slots are double-buffered by sequence number (ranks that issue different numbers of
  // collectives are outside its contract; the fingerprint check usually catches them).
  faulty_run(3, "rank=1,op=2,kind=skip", dir.path, 4, [](int r) { return r == 1 ? 2 : 4; });
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(fs::exists(dir.path / ("rank-" + std::to_string(r) + ".json"))) << r;
  const Diagnosis d = diagnose(read_flight_dumps(dir.path.string()));
  EXPECT_EQ(d.kind, "never_issued") << d.sentence;
  EXPECT_EQ(d.rank, 1) << d.sentence;
  EXPECT_EQ(d.op, "all_reduce");
  EXPECT_EQ(d.comm, "world");
  EXPECT_EQ(d.seq, 2u);
  EXPECT_NE(d.sentence.find("world rank 1 never issued all_reduce (F32 x 8, sum) #2 on "
                            "communicator 'world'"),
            std::string::npos)
      << d.sentence;
}

TEST(FlightDoctor, NamesTheRankWhoseCallDisagrees) {
  TempDir dir("tessera-fr-mismatch");
  faulty_run(3, "rank=2,op=3,kind=mismatch", dir.path);
  const Diagnosis d = diagnose(read_flight_dumps(dir.path.string()));
  EXPECT_EQ(d.kind, "mismatch") << d.sentence;
  EXPECT_EQ(d.rank, 2) << d.sentence;
  EXPECT_EQ(d.seq, 3u);
  EXPECT_EQ(d.comm, "world");
  EXPECT_NE(d.sentence.find("world rank 2 issued barrier as call #3 on communicator 'world' "
                            "where ranks 0 and 1 issued all_reduce (F32 x 8, sum)"),
            std::string::npos)
      << d.sentence;
}

TEST(FlightDoctor, NamesALateRankWithTheLag) {
  TempDir dir("tessera-fr-delay");
  faulty_run(2, "rank=0,op=2,kind=delay:2s", dir.path);
  const Diagnosis d = diagnose(read_flight_dumps(dir.path.string()));
  EXPECT_EQ(d.kind, "slow_rank") << d.sentence;
  EXPECT_EQ(d.rank, 0) << d.sentence;
  EXPECT_EQ(d.seq, 2u);
  EXPECT_GE(d.lag_seconds, 0.25) << "the peer waited its 300 ms deadline first";
  EXPECT_NE(d.sentence.find("world rank 0 was late: it issued all_reduce"), std::string::npos)
      << d.sentence;
}

TEST(FlightDoctor, NamesARankThatExited) {
  TempDir dir("tessera-fr-exit");
  faulty_run(2, "rank=1,op=3,kind=exit", dir.path);
  const Diagnosis d = diagnose(read_flight_dumps(dir.path.string()));
  EXPECT_EQ(d.kind, "dead_rank") << d.sentence;
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.op, "all_reduce");
  EXPECT_EQ(d.seq, 3u);
  EXPECT_NE(d.sentence.find("world rank 1 is dead: it exited"), std::string::npos) << d.sentence;
}

TEST(FlightDoctor, NamesARankWithoutADumpAndSaysWhenAllCompleted) {
  TempDir dir("tessera-fr-ok");
  CommOptions o;
  o.flight_recorder = dir.path.string();
  spawn(
      3,
      [&](Communicator& c) {
        float x[2] = {};
        c.all_reduce(x, 2, DType::F32).wait();
        EXPECT_NE(c.flight_recorder()->dump("signal", ""), "");
      },
      o);
  std::vector<json> dumps = read_flight_dumps(dir.path.string());
  ASSERT_EQ(dumps.size(), 3u);
  const Diagnosis ok = diagnose(dumps);
  EXPECT_EQ(ok.kind, "all_completed");
  EXPECT_NE(ok.sentence.find("every recorded call completed on every rank (3 of 3 ranks dumped)"),
            std::string::npos)
      << ok.sentence;
  // Rank 2's dump is gone and the others wait in a call: rank 2 is dead.
  dumps.pop_back();
  for (json& j : dumps) j["records"].back()["state"] = "started";
  const Diagnosis dead = diagnose(dumps);
  EXPECT_EQ(dead.kind, "dead_rank");
  EXPECT_EQ(dead.rank, 2);
  EXPECT_NE(dead.sentence.find("world rank 2 is dead: it left no dump"), std::string::npos)
      << dead.sentence;
  EXPECT_NE(dead.sentence.find("all_reduce (F32 x 2, sum) #1 on communicator 'world'"),
            std::string::npos)
      << dead.sentence;
  // Not a dump: refused.
  dumps[0]["format"] = "something else";
  EXPECT_THROW(diagnose(dumps), ConfigError);
  EXPECT_THROW(read_flight_dumps((dir.path / "nothing-here").string()), IoError);
}

// A dump as an MPI rank writes it, made up: all-reduces on 'dp' with these sequence numbers and
// states (t: the issue time in ms).
json made_up_dump(int rank, const std::vector<std::tuple<uint64_t, std::string, int>>& calls) {
  json recs = json::array();
  uint64_t id = 0;
  for (const auto& [seq, state, t] : calls)
    recs.push_back({{"id", ++id},
                    {"comm", "dp"},
                    {"seq", seq},
                    {"call", seq},
                    {"op", "all_reduce"},
                    {"dtype", "F32"},
                    {"count", 10 + seq},
                    {"reduce", "sum"},
                    {"state", state},
                    {"queued_ns", t * 1000000},
                    {"ended_ns", state == "completed" ? t * 1000000 + 1000 : -1}});
  return {{"format", "tessera-flight-recorder"},
          {"version", kFlightRecorderVersion},
          {"world_rank", rank},
          {"world_size", 2},
          {"reason", "error"},
          {"error", ""},
          {"anchor_wall_ns", 1000000000},
          {"communicators", json::array({{{"name", "dp"}, {"rank", rank}, {"size", 2}}})},
          {"records", recs}};
}

TEST(FlightDoctor, NamesARankWithAGapInItsSequenceNumbers) {
  // Under MPI rank 0's #3 completed, paired with rank 1's #4: rank 1 never issued #3.
  const std::vector<json> dumps = {
      made_up_dump(
          0, {{1, "completed", 0}, {2, "completed", 10}, {3, "completed", 20}, {4, "failed", 30}}),
      made_up_dump(1, {{1, "completed", 0}, {2, "completed", 10}, {4, "failed", 20}})};
  const Diagnosis d = diagnose(dumps);
  EXPECT_EQ(d.kind, "never_issued") << d.sentence;
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.seq, 3u);
  EXPECT_NE(d.sentence.find("world rank 1 never issued all_reduce (F32 x 13, sum) #3 on "
                            "communicator 'dp', which rank 0 issued and completed"),
            std::string::npos)
      << d.sentence;
  // Without the gap (rank 1 stopped after #2 completed, rank 0's #3 completed): nothing missing.
  const std::vector<json> fine = {
      made_up_dump(0, {{1, "completed", 0}, {2, "completed", 10}, {3, "completed", 20}}),
      made_up_dump(1, {{1, "completed", 0}, {2, "completed", 10}})};
  EXPECT_EQ(diagnose(fine).kind, "all_completed");
}

}  // namespace
}  // namespace tessera::comm::test
