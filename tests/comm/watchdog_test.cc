// comm/watchdog.h: a call that overruns its deadline ends the process with the message; one that
// returns in time leaves no trace.
#include "tessera/comm/watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace tessera::comm::detail {
namespace {

TEST(Watchdog, ACallThatReturnsInTimeIsLeftAlone) {
  int formatted = 0;
  for (int i = 0; i < 3; ++i) {
    const Watchdog w(Timeout(10'000), [&] {
      ++formatted;
      return std::string("never");
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(formatted, 0);  // the message is only formatted when the watchdog fires
}

TEST(WatchdogDeathTest, ACallPastItsDeadlineEndsTheProcessNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const Watchdog w(Timeout(50), [] { return std::string("split #4 on communicator 'x'"); });
        std::this_thread::sleep_for(std::chrono::seconds(30));  // a call that never returns
      },
      ::testing::ExitedWithCode(1), "^tessera: error: split #4 on communicator 'x'\n");
}

}  // namespace
}  // namespace tessera::comm::detail
