#include "tessera/parallel/pipeline/schedule_deadlock.h"

#include "tessera/core/error.h"
#include "tessera/parallel/pipeline/schedule_replay.h"

namespace tessera::parallel {

using ::tessera::detail::concat;

std::string DeadlockReport::message() const {
  if (stuck.empty()) return "no deadlock: every rank runs to the end";
  std::string msg = "deadlock: ";
  for (size_t i = 0; i < stuck.size(); ++i) {
    const StuckRank& st = stuck[i];
    msg += concat(i ? "; " : "", "rank ", st.rank, " waits at action ", st.index, " (",
                  to_string(st.action), ")");
    if (st.peer >= 0) msg += concat(" for rank ", st.peer);
    msg += ": " + st.reason;
  }
  return msg;
}

namespace {

// Why the send that rank `r`'s receive `a` waits for is never posted.
StuckRank explain(const Schedule& s, const std::vector<size_t>& next, int r, size_t index) {
  const Action& a = s.ranks[static_cast<size_t>(r)][index];
  StuckRank st{r, index, a, -1, ""};
  const TransferKey key = transfer_key(s, r, a);
  const int from = key.from_stage();
  if (from < 0 || from >= s.num_model_stages()) {
    st.reason = concat("stage ", key.to_stage, " has no ", key.backward ? "next" : "previous",
                       " stage to send it");
    return st;
  }
  st.peer = from % s.pp;
  const std::vector<Action>& peer_list = s.ranks[static_cast<size_t>(st.peer)];
  const size_t peer_next = next[static_cast<size_t>(st.peer)];
  for (size_t j = peer_next; j < peer_list.size(); ++j) {
    const Action& b = peer_list[j];
    if (!is_send(b.kind) || !(transfer_key(s, st.peer, b) == key)) continue;
    st.reason = concat("rank ", st.peer, " is itself stuck at ", to_string(peer_list[peer_next]),
                       " (action ", peer_next, ") before its ", to_string(b), " (action ", j, ")");
    return st;
  }
  st.reason = peer_next >= peer_list.size()
                  ? concat("rank ", st.peer, " finished without sending it")
                  : concat("rank ", st.peer, " never sends it");
  return st;
}

}  // namespace

DeadlockReport deadlock_report(const Schedule& s, const std::vector<size_t>& next) {
  DeadlockReport report;
  for (size_t r = 0; r < s.ranks.size(); ++r)
    if (next[r] < s.ranks[r].size())
      report.stuck.push_back(explain(s, next, static_cast<int>(r), next[r]));
  return report;
}

DeadlockReport check_deadlock(const Schedule& s) {
  const Replay run = replay_schedule(
      s, [](int, const Action&) { return 1.0; }, 0.0);
  return deadlock_report(s, run.next);
}

}  // namespace tessera::parallel
