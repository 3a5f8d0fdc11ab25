#include "tessera/nn/moe_exchange.h"

#include <utility>

namespace tessera::nn {

PendingExchange::PendingExchange(comm::Work work, std::string label, const char* category)
    : work_(std::move(work)),
      label_(std::move(label)),
      category_(category),
      start_(TraceClock::now()),
      tracer_(Tracer::current()),
      posted_(true) {}

PendingExchange::~PendingExchange() {
  if (!posted_ || recorded_) return;
  try {
    work_.wait();
  } catch (...) {  // the error reached (or will reach) the caller through another path
  }
}

bool PendingExchange::done() const {
  return posted_ && work_.is_completed();
}

void PendingExchange::wait() {
  if (!posted_) return;
  if (tracer_ && !work_.is_completed()) {  // the caller has nothing else to do: a wait
    const TraceClock::time_point begin = TraceClock::now();
    work_.wait();
    tracer_->record("wait for " + label_, "wait", 0, begin, TraceClock::now());
  }
  work_.wait();
  if (!recorded_) {
    recorded_ = true;
    if (tracer_ && !label_.empty())
      tracer_->record(std::move(label_), category_, 1, start_, TraceClock::now());
  }
}

PendingExchange post_rows(comm::Communicator& group, const float* send,
                          const std::vector<size_t>& send_rows, float* recv,
                          const std::vector<size_t>& recv_rows, int C, std::string label) {
  std::vector<size_t> sc(send_rows), rc(recv_rows);
  for (size_t& c : sc) c *= static_cast<size_t>(C);
  for (size_t& c : rc) c *= static_cast<size_t>(C);
  comm::AllToAllOptions o;
  o.async = true;
  return PendingExchange(group.all_to_allv(send, sc, recv, rc, DType::F32, o), std::move(label));
}

PendingExchange post_counts(comm::Communicator& group, const int64_t* send, int64_t* recv,
                            int per_rank, std::string label) {
  comm::AllToAllOptions o;
  o.async = true;
  return PendingExchange(group.all_to_all(send, recv, static_cast<size_t>(per_rank), DType::I64, o),
                         std::move(label));
}

}  // namespace tessera::nn
