#include "tessera/parallel/pipeline/schedule_replay.h"

#include <algorithm>
#include <deque>
#include <map>

namespace tessera::parallel {

bool Replay::finished(const Schedule& s) const {
  for (size_t r = 0; r < s.ranks.size(); ++r)
    if (next[r] < s.ranks[r].size()) return false;
  return true;
}

TransferKey transfer_key(const Schedule& s, int rank, const Action& a) {
  const int stage = s.stage_of(rank, a.chunk);
  switch (a.kind) {
    case ActionKind::SendForward:
      return {false, a.micro_batch, stage + 1};
    case ActionKind::SendBackward:
      return {true, a.micro_batch, stage - 1};
    case ActionKind::RecvBackward:
      return {true, a.micro_batch, stage};
    default:
      return {false, a.micro_batch, stage};
  }
}

Replay replay_schedule(const Schedule& s, const ActionDuration& duration, double p2p_latency) {
  const size_t n = s.ranks.size();
  Replay out;
  out.ranks.resize(n);
  out.next.assign(n, 0);
  std::vector<double> clock(n, 0.0);
  std::map<TransferKey, std::deque<double>> posted;  // arrival times of sends not yet received
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t r = 0; r < n; ++r) {
      const std::vector<Action>& list = s.ranks[r];
      while (out.next[r] < list.size()) {
        const Action& a = list[out.next[r]];
        const double start = clock[r];
        if (is_send(a.kind)) {
          posted[transfer_key(s, static_cast<int>(r), a)].push_back(start + p2p_latency);
        } else if (is_recv(a.kind)) {
          auto it = posted.find(transfer_key(s, static_cast<int>(r), a));
          if (it == posted.end() || it->second.empty()) break;
          clock[r] = std::max(clock[r], it->second.front());
          it->second.pop_front();
        } else {
          clock[r] += duration(static_cast<int>(r), a);
        }
        out.ranks[r].push_back({a, start, clock[r]});
        ++out.next[r];
        progress = true;
      }
    }
  }
  return out;
}

}  // namespace tessera::parallel
