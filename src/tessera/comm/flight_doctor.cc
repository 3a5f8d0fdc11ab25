#include "tessera/comm/flight_doctor.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "tessera/comm/errors.h"
#include "tessera/comm/flight_recorder.h"
#include "tessera/core/error.h"

namespace tessera::comm {

using nlohmann::json;

nlohmann::json Diagnosis::to_json() const {
  json j = {{"diagnosis", kind}, {"sentence", sentence}, {"evidence", evidence}};
  if (rank >= 0) j["rank"] = rank;
  if (!op.empty()) j["call"] = {{"op", op}, {"comm", comm}, {"seq", seq}};
  j["lag_s"] = lag_seconds;
  return j;
}

std::vector<json> read_flight_dumps(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw IoError(detail::concat("'", dir, "' is not a directory of flight recorder dumps"));
  std::vector<std::pair<int, json>> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("rank-") || !name.ends_with(".json")) continue;
    std::ifstream in(e.path());
    json j;
    try {
      in >> j;
    } catch (const std::exception& x) {
      throw IoError(
          detail::concat("cannot read flight recorder dump '", e.path().string(), "': ", x.what()));
    }
    found.push_back({j.value("world_rank", -1), std::move(j)});
  }
  if (found.empty())
    throw IoError(detail::concat("no flight recorder dumps (rank-<R>.json) in '", dir,
                                 "': was the run given --flight-recorder ", dir, "?"));
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<json> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

namespace {

struct Rec {
  int rank = 0;
  std::string comm, op, dtype, reduce, state;
  uint64_t seq = 0, count = 0;
  uint64_t id = 0;  // the call's place in its rank's issue order
  int root = -1;
  double issued = 0;  // seconds on the common time line
  double ended = -1;
  bool completed() const { return state == "completed"; }
  // What the ranks must agree on.
  std::string fingerprint() const {
    std::ostringstream os;
    os << op;
    if (op != "barrier" && op != "split") {
      os << " (" << dtype << " x " << count;
      if (!reduce.empty()) os << ", " << reduce;
      if (root >= 0) os << ", root " << root;
      os << ")";
    }
    return os.str();
  }
  std::string call() const { return detail::concat(op, " #", seq); }
};

struct RankDump {
  int rank = -1;
  std::string reason, error, host, first_reason;
  int64_t pid = 0;
  std::map<std::string, int> comms;                     // name -> size
  std::map<std::string, std::map<uint64_t, Rec>> coll;  // comm -> seq -> record (collectives)
  std::vector<Rec> all;                                 // every record, oldest first
  bool exited() const { return reason == "exit" || first_reason == "exit"; }
};

std::string ranks_str(const std::vector<int>& r) {
  std::string s = r.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < r.size(); ++i)
    s += (i ? (i + 1 == r.size() ? " and " : ", ") : "") + std::to_string(r[i]);
  return s;
}

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

std::string describe(const Rec& r) {
  std::string s = detail::concat("rank ", r.rank, ": ", r.fingerprint(), " #", r.seq, " on '",
                                 r.comm, "' issued at +", secs(r.issued), ", ", r.state);
  if (r.ended >= 0) s += detail::concat(" at +", secs(r.ended));
  return s;
}

}  // namespace

Diagnosis diagnose(const std::vector<json>& dumps) {
  if (dumps.empty()) throw ConfigError("no flight recorder dumps to diagnose");
  // Parse, putting every time on one line: seconds since the earliest anchor.
  int64_t origin = INT64_MAX;
  int world = 0;
  for (const json& j : dumps) {
    if (j.value("format", std::string()) != "tessera-flight-recorder" ||
        j.value("version", 0) != kFlightRecorderVersion)
      throw ConfigError(detail::concat("not a flight recorder dump of version ",
                                       kFlightRecorderVersion, " (world rank ",
                                       j.value("world_rank", -1), ")"));
    origin = std::min<int64_t>(origin, j.at("anchor_wall_ns").get<int64_t>());
    world = std::max(world, j.value("world_size", 0));
  }
  std::map<int, RankDump> ranks;
  for (const json& j : dumps) {
    RankDump d;
    d.rank = j.at("world_rank").get<int>();
    d.reason = j.value("reason", std::string());
    d.error = j.value("error", std::string());
    d.host = j.value("host", std::string());
    d.pid = j.value("pid", int64_t{0});
    if (j.contains("first_failure"))
      d.first_reason = j["first_failure"].value("reason", std::string());
    for (const json& c : j.at("communicators")) d.comms[c.at("name")] = c.at("size").get<int>();
    const double base = 1e-9 * static_cast<double>(j.at("anchor_wall_ns").get<int64_t>() - origin);
    for (const json& e : j.at("records")) {
      Rec r;
      r.rank = d.rank;
      r.comm = e.at("comm");
      r.op = e.at("op");
      r.dtype = e.value("dtype", std::string());
      r.reduce = e.value("reduce", std::string());
      r.state = e.at("state");
      r.seq = e.value("seq", uint64_t{0});
      r.id = e.value("id", uint64_t{0});
      r.count = e.value("count", uint64_t{0});
      r.root = e.value("root", -1);
      r.issued = base + 1e-9 * static_cast<double>(e.at("queued_ns").get<int64_t>());
      const int64_t end = e.value("ended_ns", int64_t{-1});
      r.ended = end >= 0 ? base + 1e-9 * static_cast<double>(end) : -1;
      if (r.seq > 0) d.coll[r.comm][r.seq] = r;
      d.all.push_back(std::move(r));
    }
    ranks[d.rank] = std::move(d);
  }

  Diagnosis g;
  auto dumps_line = [&] {
    std::string s = "dumps:";
    for (const auto& [r, d] : ranks)
      s += detail::concat(" rank ", r, " (", d.reason, ", ", d.all.size(), " records, ", d.host,
                          " pid ", d.pid, ")");
    return s;
  };
  // Members of each communicator: the dumps that hold it.
  std::map<std::string, std::vector<int>> members;
  for (const auto& [r, d] : ranks)
    for (const auto& [name, size] : d.comms) members[name].push_back(r);
  // The calls that did not complete, earliest first.
  std::vector<Rec> stuck;
  for (const auto& [r, d] : ranks)
    for (const Rec& x : d.all)
      if (!x.completed()) stuck.push_back(x);
  std::sort(stuck.begin(), stuck.end(),
            [](const Rec& a, const Rec& b) { return a.issued < b.issued; });
  // The largest issue lag over the calls every member issued.
  struct Lag {
    double lag = -1;
    Rec late, first;
  } worst, worst_stuck;  // over every call; over the calls that did not complete on some rank
  for (const auto& [name, ms] : members) {
    std::map<uint64_t, std::vector<const Rec*>> by_seq;
    for (int m : ms) {
      auto it = ranks[m].coll.find(name);
      if (it == ranks[m].coll.end()) continue;
      for (const auto& [s, x] : it->second) by_seq[s].push_back(&x);
    }
    for (const auto& [s, xs] : by_seq) {
      if (xs.size() != ms.size() || xs.size() < 2) continue;
      auto [lo, hi] = std::minmax_element(
          xs.begin(), xs.end(), [](const Rec* a, const Rec* b) { return a->issued < b->issued; });
      const double lag = (*hi)->issued - (*lo)->issued;
      if (lag > worst.lag) worst = {lag, **hi, **lo};
      bool done = true;
      for (const Rec* x : xs) done = done && x->completed();
      if (!done && lag > worst_stuck.lag) worst_stuck = {lag, **hi, **lo};
    }
  }
  g.lag_seconds = std::max(0.0, worst.lag);
  auto name_call = [&](const Rec& r) {
    g.op = r.op;
    g.comm = r.comm;
    g.seq = r.seq;
  };

  // dead_rank: missing dumps, or a dump that says the rank exited.
  std::vector<int> dead;
  for (int r = 0; r < world; ++r)
    if (!ranks.contains(r) || ranks[r].exited()) dead.push_back(r);
  if (!dead.empty() && dead.size() < static_cast<size_t>(world)) {
    const int r = dead[0];
    g.kind = "dead_rank";
    g.rank = r;
    const bool no_dump = !ranks.contains(r);
    // What the others were waiting in: the first call that did not complete on a communicator
    // the dead rank belongs to (any, when its dump is missing).
    std::optional<Rec> waiting;
    for (const Rec& x : stuck)
      if (x.rank != r && (no_dump || ranks[r].comms.contains(x.comm))) {
        waiting = x;
        break;
      }
    std::string how =
        no_dump ? "left no dump (it died or was killed)" : "exited (its dump's reason is its exit)";
    if (waiting) {
      name_call(*waiting);
      g.sentence = detail::concat("world rank ", r, " is dead: it ", how, " while rank ",
                                  waiting->rank, " waited for it in ", waiting->fingerprint(), " #",
                                  waiting->seq, " on communicator '", waiting->comm, "'");
    } else {
      g.sentence = detail::concat("world rank ", r, " is dead: it ", how,
                                  "; no other rank was left waiting in a recorded call");
    }
    if (!no_dump) {
      if (!ranks[r].error.empty())
        g.evidence.push_back("rank " + std::to_string(r) + ": " + ranks[r].error);
      if (!ranks[r].all.empty())
        g.evidence.push_back(
            detail::concat("rank ", r, "'s last record: ", describe(ranks[r].all.back())));
    }
    const std::string needle = detail::concat("rank ", r);
    for (const auto& [o, d] : ranks)
      if (o != r && !d.error.empty())
        g.evidence.push_back(detail::concat(
            "rank ", o, " (", d.reason, ")",
            d.error.find(needle) != std::string::npos ? " names it: " : ": ", d.error));
    for (size_t i = 1; i < dead.size(); ++i)
      g.evidence.push_back(detail::concat("world rank ", dead[i], " is dead too"));
    g.evidence.push_back(dumps_line());
    return g;
  }

  // mismatch: the earliest (comm, seq) where the members' calls differ.
  {
    std::optional<std::pair<double, std::vector<Rec>>> first;
    for (const auto& [name, ms] : members) {
      std::map<uint64_t, std::vector<Rec>> by_seq;
      for (int m : ms)
        if (auto it = ranks[m].coll.find(name); it != ranks[m].coll.end())
          for (const auto& [s, x] : it->second) by_seq[s].push_back(x);
      for (const auto& [s, xs] : by_seq) {
        bool same = true;
        for (const Rec& x : xs) same = same && x.fingerprint() == xs[0].fingerprint();
        if (same) continue;
        double t = xs[0].issued;
        for (const Rec& x : xs) t = std::min(t, x.issued);
        if (!first || t < first->first) first = {t, xs};
        break;  // the earliest sequence number of this communicator
      }
    }
    if (first) {
      std::vector<std::pair<std::string, std::vector<int>>> groups;  // fingerprint -> ranks
      std::map<std::string, Rec> example;
      for (const Rec& x : first->second) {
        auto it = std::find_if(groups.begin(), groups.end(),
                               [&](const auto& p) { return p.first == x.fingerprint(); });
        if (it == groups.end()) {
          groups.push_back({x.fingerprint(), {x.rank}});
          example[x.fingerprint()] = x;
        } else {
          it->second.push_back(x.rank);
        }
      }
      std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
        return a.second.size() < b.second.size();
      });
      const auto& odd = groups.front();
      const auto& rest = groups.back();
      const Rec& x = example[odd.first];
      const Rec& y = example[rest.first];
      g.kind = "mismatch";
      name_call(y);
      if (odd.second.size() < rest.second.size()) {
        g.rank = odd.second[0];
        g.sentence = detail::concat("world ", ranks_str(odd.second), " issued ", x.fingerprint(),
                                    " as call #", x.seq, " on communicator '", x.comm, "' where ",
                                    ranks_str(rest.second), " issued ", y.fingerprint(),
                                    ": the ranks disagree on the call's op or size");
      } else {
        std::string who;
        for (size_t i = 0; i < groups.size(); ++i)
          who += detail::concat(i ? "; " : "", ranks_str(groups[i].second), " issued ",
                                example[groups[i].first].fingerprint());
        g.sentence = detail::concat("the ranks of communicator '", x.comm,
                                    "' disagree on its call #", x.seq, ": ", who);
      }
      for (const Rec& r : first->second) g.evidence.push_back(describe(r));
      for (const auto& [o, d] : ranks)
        if (!d.error.empty()) g.evidence.push_back(detail::concat("rank ", o, ": ", d.error));
      g.evidence.push_back(dumps_line());
      return g;
    }
  }

  // never_issued: the earliest call that some members issued and did not complete, of which
  // another member has no record although its records cover it (or stop before it).
  {
    // Candidates are ranked: a rank that went past the call on the same communicator (it has a
    // later call there) first; then the call's place in the issuers' order (ranks of one program
    // issue their calls in the same order), then its time.
    struct Missing {
      bool went_past;
      bool waited;  // some issuer's call did not complete
      uint64_t place;
      double t;
      int rank;
      Rec seen;
      std::vector<int> issued_by;
      bool before(const Missing& o) const {
        if (went_past != o.went_past) return went_past;
        if (place != o.place) return place < o.place;
        return t < o.t;
      }
    };
    std::optional<Missing> first;
    for (const auto& [name, ms] : members) {
      std::map<uint64_t, std::vector<Rec>> by_seq;
      for (int m : ms)
        if (auto it = ranks[m].coll.find(name); it != ranks[m].coll.end())
          for (const auto& [s, x] : it->second) by_seq[s].push_back(x);
      for (const auto& [s, xs] : by_seq) {
        if (xs.size() == ms.size()) continue;
        bool waited = false;
        double t = xs[0].issued;
        uint64_t place = xs[0].id;
        std::vector<int> by;
        for (const Rec& x : xs) {
          waited = waited || !x.completed();
          t = std::min(t, x.issued);
          place = std::min(place, x.id);
          by.push_back(x.rank);
        }
        // A call that completed where it was issued counts only against a rank that went past it
        // (a gap in its own sequence numbers): under MPI, whose collectives carry no sequence
        // number, the issuers' call then completed paired with the skipping rank's next one.
        bool found = false;
        for (int m : ms) {
          if (std::find(by.begin(), by.end(), m) != by.end()) continue;
          const auto it = ranks[m].coll.find(name);
          // It holds the communicator and no call of it at all; or its ring covers s and it went
          // past s (a later call) or its call before s completed. A rank whose call before s
          // failed or never completed was stopped there: a victim, not the cause.
          bool culprit = it == ranks[m].coll.end(), past = false;
          if (!culprit && it->second.begin()->first < s) {
            const auto next = it->second.upper_bound(s);
            past = next != it->second.end();
            culprit = past || std::prev(next)->second.completed();
          }
          culprit = culprit && (waited || past);
          const Missing cand{past, waited, place, t, m, xs[0], by};
          if (culprit && (!first || cand.before(*first))) first = cand;
          found = found || culprit;
        }
        if (found) break;
      }
    }
    // A late rank explains calls its peers issued after the late one and it never reached.
    const bool late_first = worst_stuck.lag >= 0.1 &&
                            (!first || (!first->went_past && worst_stuck.first.issued <= first->t));
    if (first && !late_first) {
      const Rec& x = first->seen;
      g.kind = "never_issued";
      g.rank = first->rank;
      name_call(x);
      const RankDump& d = ranks[first->rank];
      std::string before, after;
      if (auto it = d.coll.find(x.comm); it != d.coll.end()) {
        auto next = it->second.upper_bound(x.seq);
        if (next != it->second.begin()) {
          const Rec& p = std::prev(next)->second;
          before =
              detail::concat("its last call there before it was ", p.call(), " (", p.state, ")");
        }
        if (next != it->second.end())
          after =
              detail::concat("its next was ", next->second.call(), " (", next->second.state, ")");
      }
      std::string own = before.empty() ? after : after.empty() ? before : before + "; " + after;
      if (own.empty()) own = "it has no record of any call there";
      g.sentence =
          detail::concat("world rank ", first->rank, " never issued ", x.fingerprint(), " #", x.seq,
                         " on communicator '", x.comm, "', which ", ranks_str(first->issued_by),
                         first->waited ? " issued and waited in ("
                                       : " issued and completed, paired with another call of its "
                                         "(MPI collectives carry no sequence number; "
                                         "TESSERA_COMM_DEBUG=1 checks them; ",
                         own, ")");
      for (const auto& [o, dd] : ranks)
        if (auto it = dd.coll.find(x.comm); it != dd.coll.end())
          if (auto r = it->second.find(x.seq); r != it->second.end())
            g.evidence.push_back(describe(r->second));
      for (const auto& [o, dd] : ranks)
        if (!dd.error.empty()) g.evidence.push_back(detail::concat("rank ", o, ": ", dd.error));
      g.evidence.push_back(dumps_line());
      return g;
    }
  }

  // slow_rank / all_completed / incomplete.
  auto lag_line = [&] {
    return detail::concat("largest issue lag: rank ", worst.late.rank, " issued ",
                          worst.late.fingerprint(), " #", worst.late.seq, " on '", worst.late.comm,
                          "' ", secs(worst.lag), " after rank ", worst.first.rank);
  };
  if (stuck.empty()) {
    g.kind = "all_completed";
    g.sentence = detail::concat("every recorded call completed on every rank (", ranks.size(),
                                " of ", world, " ranks dumped)");
    if (worst.lag >= 0) {
      g.rank = worst.late.rank;
      name_call(worst.late);
      g.evidence.push_back(lag_line());
    }
    g.evidence.push_back(dumps_line());
    return g;
  }
  // A late rank: the largest lag at a call that did not complete on some rank, when it is over a
  // tenth of a second.
  if (worst_stuck.lag >= 0.1) {
    worst = worst_stuck;
    g.lag_seconds = worst.lag;
    g.kind = "slow_rank";
    g.rank = worst.late.rank;
    name_call(worst.late);
    g.sentence = detail::concat("world rank ", worst.late.rank, " was late: it issued ",
                                worst.late.fingerprint(), " #", worst.late.seq,
                                " on communicator '", worst.late.comm, "' ", secs(worst.lag),
                                " after rank ", worst.first.rank, " did");
    g.evidence.push_back(lag_line());
    for (const auto& [o, d] : ranks)
      if (auto it = d.coll.find(worst.late.comm); it != d.coll.end())
        if (auto r = it->second.find(worst.late.seq); r != it->second.end())
          g.evidence.push_back(describe(r->second));
    for (const auto& [o, d] : ranks)
      if (!d.error.empty()) g.evidence.push_back(detail::concat("rank ", o, ": ", d.error));
    g.evidence.push_back(dumps_line());
    return g;
  }
  const Rec& s = stuck.front();
  g.kind = "incomplete";
  g.rank = s.rank;
  name_call(s);
  g.sentence = detail::concat(s.fingerprint(), " #", s.seq, " on communicator '", s.comm,
                              "' did not complete on world rank ", s.rank,
                              " (the earliest such call); no rank stands out as missing, "
                              "late or disagreeing");
  for (size_t i = 0; i < std::min<size_t>(stuck.size(), 8); ++i)
    g.evidence.push_back(describe(stuck[i]));
  for (const auto& [o, d] : ranks)
    if (!d.error.empty()) g.evidence.push_back(detail::concat("rank ", o, ": ", d.error));
  g.evidence.push_back(dumps_line());
  return g;
}

}  // namespace tessera::comm
