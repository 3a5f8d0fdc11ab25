// comm::placeholder_group (launch.h): a communicator that has a size and a rank and nothing else.
#include <memory>

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"

namespace tessera::comm {

namespace {

class PlaceholderGroup final : public Communicator {
 public:
  PlaceholderGroup(int size, int rank, CommOptions opts)
      : Communicator(std::move(opts)), size_(size), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "placeholder"; }

 protected:
  void execute(const detail::OpDesc& d) override {
    TESSERA_ASSERT(false, where(d), ": a placeholder group (a planner's) cannot communicate");
  }
  std::unique_ptr<Communicator> do_split(int, int, const std::string&, Timeout) override {
    TESSERA_ASSERT(false, "a placeholder group (a planner's) cannot be split");
  }

 private:
  int size_, rank_;
};

}  // namespace

std::unique_ptr<Communicator> placeholder_group(int size, int rank) {
  TESSERA_ASSERT(size >= 1 && rank >= 0 && rank < size, "a placeholder group of ", size,
                 " ranks has no rank ", rank);
  CommOptions o;
  o.name = "placeholder";
  return std::make_unique<PlaceholderGroup>(size, rank, o);
}

}  // namespace tessera::comm
