#include "tessera/parallel/pipeline/schedule_validate.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "tessera/core/error.h"
#include "tessera/parallel/pipeline/schedule_replay.h"

namespace tessera::parallel {
namespace {

using ::tessera::detail::concat;

// Where one kind of action of one (chunk, micro-batch) sits in a rank's list.
struct Seen {
  int first = -1;  // index of the first occurrence
  int count = 0;
  void add(int index) {
    if (count++ == 0) first = index;
  }
};

struct MicroBatchActions {
  Seen f, b, bi, w, recv_f, send_f, recv_b, send_b;
};

// Sending rank, receiving rank, direction (true: gradients).
using Channel = std::tuple<int, int, bool>;

struct Endpoint {
  int rank;
  Action action;
};

class Validator {
 public:
  explicit Validator(const Schedule& s) : s_(s) {}

  std::vector<std::string> run() {
    if (!check_shape()) return problems_;
    for (int r = 0; r < s_.pp; ++r) check_rank(r);
    check_matching();
    return problems_;
  }

 private:
  template <typename... Args>
  void problem(Args&&... args) {
    problems_.push_back(concat(std::forward<Args>(args)...));
  }

  bool check_shape() {
    if (s_.pp < 1 || s_.micro_batches < 1 || s_.virtual_stages < 1) {
      problem("the schedule needs at least 1 rank, micro-batch and chunk (it has ", s_.pp, ", ",
              s_.micro_batches, ", ", s_.virtual_stages, ")");
      return false;
    }
    if (static_cast<int>(s_.ranks.size()) != s_.pp) {
      problem("the schedule has action lists for ", s_.ranks.size(), " ranks but ", s_.pp,
              " pipeline ranks");
      return false;
    }
    return true;
  }

  std::string at(int rank, int chunk) const {
    return concat("rank ", rank, " (stage ", s_.stage_of(rank, chunk), ")");
  }

  void check_rank(int r) {
    const std::vector<Action>& list = s_.ranks[static_cast<size_t>(r)];
    const int v = s_.virtual_stages, m = s_.micro_batches;
    std::vector<MicroBatchActions> seen(static_cast<size_t>(v * m));
    std::vector<std::vector<int>> backwards(static_cast<size_t>(v));  // per chunk: B / BI indices
    Seen reduce, step;
    int last_compute = -1;
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[static_cast<size_t>(i)];
      if (a.kind == ActionKind::ReduceGradients) {
        reduce.add(i);
        continue;
      }
      if (a.kind == ActionKind::OptimizerStep) {
        step.add(i);
        continue;
      }
      if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= v) {
        problem("rank ", r, ": action ", i, " (", to_string(a), ", chunk ", a.chunk,
                ") is outside the schedule's ", m, " micro-batches and ", v, " chunks");
        continue;
      }
      if (is_compute(a.kind)) last_compute = i;
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput)
        backwards[static_cast<size_t>(a.chunk)].push_back(i);
      if (is_send(a.kind) || is_recv(a.kind)) record_transfer(r, a);
      MicroBatchActions& mb = seen[static_cast<size_t>(a.chunk * m + a.micro_batch)];
      switch (a.kind) {
        case ActionKind::Forward:
          mb.f.add(i);
          break;
        case ActionKind::Backward:
          mb.b.add(i);
          break;
        case ActionKind::BackwardInput:
          mb.bi.add(i);
          break;
        case ActionKind::BackwardWeight:
          mb.w.add(i);
          break;
        case ActionKind::RecvForward:
          mb.recv_f.add(i);
          break;
        case ActionKind::SendForward:
          mb.send_f.add(i);
          break;
        case ActionKind::RecvBackward:
          mb.recv_b.add(i);
          break;
        case ActionKind::SendBackward:
          mb.send_b.add(i);
          break;
        default:
          break;
      }
    }
    for (int c = 0; c < v; ++c)
      for (int mbi = 0; mbi < m; ++mbi)
        check_micro_batch(r, c, mbi, seen[static_cast<size_t>(c * m + mbi)]);
    for (int c = 0; c < v; ++c)
      check_gradient_sends(r, c, list, backwards[static_cast<size_t>(c)], seen);
    check_ending(r, list, reduce, step, last_compute);
  }

  // An input gradient may live in a buffer that the chunk's next backward overwrites, so a
  // SendBackward must come before the chunk's next B or BI of another micro-batch (else that
  // micro-batch's gradient could leave in its place).
  void check_gradient_sends(int r, int c, const std::vector<Action>& list,
                            const std::vector<int>& backwards,
                            const std::vector<MicroBatchActions>& seen) {
    std::vector<bool> checked(static_cast<size_t>(s_.micro_batches), false);
    for (size_t i = 0; i < backwards.size(); ++i) {
      const int mb = list[static_cast<size_t>(backwards[i])].micro_batch;
      if (checked[static_cast<size_t>(mb)]) continue;  // a second backward: reported elsewhere
      checked[static_cast<size_t>(mb)] = true;
      const Seen& send = seen[static_cast<size_t>(c * s_.micro_batches + mb)].send_b;
      // A missing send, or one before its backward, is reported by check_micro_batch.
      if (send.count == 0 || send.first < backwards[i]) continue;
      for (size_t j = i + 1; j < backwards.size(); ++j) {
        const Action& next = list[static_cast<size_t>(backwards[j])];
        if (next.micro_batch == mb) continue;
        if (send.first > backwards[j])
          problem(at(r, c), ": ", to_string(Action{ActionKind::SendBackward, mb, c}),
                  " must come before ", to_string(next), ", chunk ", c,
                  "'s next backward, which may overwrite micro-batch ", mb, "'s input gradient");
        break;
      }
    }
  }

  void check_micro_batch(int r, int c, int mb, const MicroBatchActions& a) {
    const int stage = s_.stage_of(r, c);
    const bool first = stage == 0, last = stage == s_.num_model_stages() - 1;
    auto name = [&](ActionKind k) { return to_string(Action{k, mb, c}); };
    auto once = [&](const Seen& s, ActionKind k) {
      if (s.count != 1)
        problem(at(r, c), ": ", name(k), " runs ", s.count, " times; it must run exactly once");
    };
    once(a.f, ActionKind::Forward);
    const bool split = a.bi.count > 0 || a.w.count > 0;
    if (split && a.b.count > 0)
      problem(at(r, c), ": both ", name(ActionKind::Backward), " and ",
              name(a.bi.count > 0 ? ActionKind::BackwardInput : ActionKind::BackwardWeight),
              "; a backward is either B or BI followed by W");
    const Seen& back = split ? a.bi : a.b;
    const ActionKind back_kind = split ? ActionKind::BackwardInput : ActionKind::Backward;
    once(back, back_kind);
    if (split) once(a.w, ActionKind::BackwardWeight);
    if (a.f.count == 1 && back.count == 1 && back.first < a.f.first)
      problem(at(r, c), ": ", name(back_kind), " comes before ", name(ActionKind::Forward));
    if (split && a.bi.count == 1 && a.w.count == 1 && a.w.first < a.bi.first)
      problem(at(r, c), ": ", name(ActionKind::BackwardWeight), " comes before ",
              name(ActionKind::BackwardInput));

    // Transfers: present exactly where the stage has a neighbour, on the right side of compute.
    auto transfer = [&](const Seen& t, ActionKind k, bool needed, const Seen& anchor,
                        ActionKind anchor_kind, bool before, const char* why_not) {
      if (!needed) {
        if (t.count > 0) problem(at(r, c), ": ", name(k), " on ", why_not);
        return;
      }
      once(t, k);
      if (t.count == 1 && anchor.count == 1 && (t.first < anchor.first) != before)
        problem(at(r, c), ": ", name(k), " must come ", before ? "before " : "after ",
                name(anchor_kind));
    };
    transfer(a.recv_f, ActionKind::RecvForward, !first, a.f, ActionKind::Forward, true,
             "the first stage, which has no previous stage");
    transfer(a.send_f, ActionKind::SendForward, !last, a.f, ActionKind::Forward, false,
             "the last stage, which has no next stage");
    transfer(a.recv_b, ActionKind::RecvBackward, !last, back, back_kind, true,
             "the last stage, whose backward starts from the loss");
    transfer(a.send_b, ActionKind::SendBackward, !first, back, back_kind, false,
             "the first stage, which has no previous stage");
  }

  void check_ending(int r, const std::vector<Action>& list, const Seen& reduce, const Seen& step,
                    int last_compute) {
    if (reduce.count != 1)
      problem("rank ", r, ": ReduceGradients runs ", reduce.count,
              " times; it must run exactly once");
    if (step.count != 1)
      problem("rank ", r, ": OptimizerStep runs ", step.count, " times; it must run exactly once");
    if (step.count == 1 && step.first != static_cast<int>(list.size()) - 1)
      problem("rank ", r, ": OptimizerStep must be the last action");
    if (reduce.count == 1 && step.count == 1 && reduce.first > step.first)
      problem("rank ", r, ": ReduceGradients must come before OptimizerStep");
    if (reduce.count == 1 && last_compute > reduce.first)
      problem("rank ", r, ": ", to_string(list[static_cast<size_t>(last_compute)]),
              " comes after ReduceGradients; every gradient must be complete before it");
  }

  void record_transfer(int r, const Action& a) {
    const TransferKey key = transfer_key(s_, r, a);
    const int stages = s_.num_model_stages();
    const int from = key.from_stage();
    // A transfer to or from a stage that does not exist is reported by check_micro_batch.
    if (key.to_stage < 0 || key.to_stage >= stages || from < 0 || from >= stages) return;
    const Channel channel{from % s_.pp, key.to_stage % s_.pp, key.backward};
    if (is_send(a.kind)) {
      sends_[key].push_back({r, a});
      channel_sends_[channel].push_back(key);
    } else {
      recvs_[key].push_back({r, a});
      channel_recvs_[channel].push_back(key);
    }
  }

  void check_matching() {
    for (const auto& [key, senders] : sends_)
      if (!recvs_.count(key)) {
        const Endpoint& e = senders.front();
        problem("rank ", e.rank, ": ", to_string(e.action), " to stage ", key.to_stage, " on rank ",
                key.to_stage % s_.pp, " has no matching receive there");
      }
    for (const auto& [key, receivers] : recvs_)
      if (!sends_.count(key)) {
        const Endpoint& e = receivers.front();
        problem("rank ", e.rank, ": ", to_string(e.action), " from stage ", key.from_stage(),
                " on rank ", key.from_stage() % s_.pp, " has no matching send there");
      }
    for (const auto& [channel, sent] : channel_sends_) {
      auto it = channel_recvs_.find(channel);
      if (it == channel_recvs_.end()) continue;
      check_order(channel, sent, it->second);
    }
  }

  // Receives between two ranks in one direction must come in the order of the sends.
  void check_order(const Channel& channel, const std::vector<TransferKey>& sent,
                   const std::vector<TransferKey>& received) {
    std::vector<TransferKey> a, b;  // the transfers both sides agree exist, in each side's order
    for (const TransferKey& k : sent)
      if (recvs_.count(k)) a.push_back(k);
    for (const TransferKey& k : received)
      if (sends_.count(k)) b.push_back(k);
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (a[i] == b[i]) continue;
      const auto& [src, dst, backward] = channel;
      const char* what = backward ? "gradients" : "activations";
      problem("rank ", src, " sends ", what, " to rank ", dst, " in another order than rank ", dst,
              " receives them: transfer ", i + 1, " is ", to_string(sends_[a[i]][0].action),
              " but rank ", dst, " expects ", to_string(recvs_[b[i]][0].action));
      return;
    }
  }

  const Schedule& s_;
  std::vector<std::string> problems_;
  std::map<TransferKey, std::vector<Endpoint>> sends_, recvs_;
  std::map<Channel, std::vector<TransferKey>> channel_sends_, channel_recvs_;
};

}  // namespace

std::vector<std::string> validate_schedule(const Schedule& s) {
  return Validator(s).run();
}

void check_schedule(const Schedule& s) {
  const std::vector<std::string> problems = validate_schedule(s);
  if (problems.empty()) return;
  std::string msg = "the " + s.name + " schedule is invalid: ";
  const size_t shown = std::min<size_t>(problems.size(), 5);
  for (size_t i = 0; i < shown; ++i) msg += (i ? "; " : "") + problems[i];
  if (problems.size() > shown) msg += concat("; and ", problems.size() - shown, " more");
  throw ConfigError(msg);
}

}  // namespace tessera::parallel
