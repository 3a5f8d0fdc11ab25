// UnitHookList calls hooks as unit_hooks.h specifies (before_* in the order added, after_* in
// reverse, like nested scopes) and passes the wrapped pass's result through; GPT is a UnitModel
// whose hooks see every unit, forward ascending and backward descending.
#include "tessera/nn/unit_model.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/nn/gpt.h"

namespace tessera::nn {
namespace {

struct Recorder : UnitHooks {
  Recorder(std::string name, std::vector<std::string>& log) : name_(std::move(name)), log_(log) {}
  void before_forward(int u) override { log_.push_back(name_ + " bf" + std::to_string(u)); }
  void after_forward(int u) override { log_.push_back(name_ + " af" + std::to_string(u)); }
  void before_backward(int u) override { log_.push_back(name_ + " bb" + std::to_string(u)); }
  void after_backward(int u) override { log_.push_back(name_ + " ab" + std::to_string(u)); }
  std::string name_;
  std::vector<std::string>& log_;
};

TEST(UnitHookList, NestsHooksAndReturnsThePassResult) {
  std::vector<std::string> log;
  Recorder a("a", log), b("b", log), c("c", log);
  UnitHookList hooks;
  hooks.add(&a);
  hooks.add(&b);
  hooks.add(&c);
  hooks.remove(&c);
  const double loss = hooks.forward(3, [&] {
    log.push_back("run");
    return 2.5;
  });
  EXPECT_EQ(loss, 2.5);
  hooks.backward(3, [&] { log.push_back("run"); });
  EXPECT_EQ(log, (std::vector<std::string>{"a bf3", "b bf3", "run", "b af3", "a af3", "a bb3",
                                           "b bb3", "run", "b ab3", "a ab3"}));
}

TEST(UnitModel, GptCallsHooksAroundEveryUnit) {
  GPTConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.block_size = 4;
  cfg.vocab_size = 8;
  Allocator alloc("test");
  GPT gpt(cfg, 1, alloc);
  UnitModel& model = gpt;
  EXPECT_EQ(model.first_unit(), 0);
  EXPECT_EQ(model.last_unit(), 3);
  EXPECT_EQ(model.unit_begin(0), 0);
  EXPECT_EQ(model.unit_begin(4), model.params().numel());
  EXPECT_EQ(model.tied_unit(3), 0);
  EXPECT_TRUE(model.holds_whole_model());
  std::vector<std::string> log;
  Recorder r("h", log);
  model.add_hooks(&r);
  gpt.initialize(1);
  const std::vector<int32_t> tokens{1, 2, 3, 4}, targets{2, 3, 4, 5};
  gpt.forward(Batch{tokens.data(), targets.data(), 1, 4, 0}, StepContext{});
  gpt.backward();
  model.remove_hooks(&r);
  gpt.forward(Batch{tokens.data(), targets.data(), 1, 4, 0}, StepContext{});
  EXPECT_EQ(log, (std::vector<std::string>{"h bf0", "h af0", "h bf1", "h af1", "h bf2", "h af2",
                                           "h bf3", "h af3", "h bb3", "h ab3", "h bb2", "h ab2",
                                           "h bb1", "h ab1", "h bb0", "h ab0"}));
}

}  // namespace
}  // namespace tessera::nn
