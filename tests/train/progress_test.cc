// The progress line redraws itself on a terminal and prints lines elsewhere, including on the
// pseudo-terminal Open MPI gives a rank (whose output may well end in a log file).
#include "tessera/train/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <termios.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace tessera::train {
namespace {

// What three steps (of three) print on a fresh pseudo-terminal, as the reader of its other end
// sees the bytes (raw mode: no newline translation).
std::string three_steps_on_a_terminal() {
  int reader = -1, writer = -1;
  if (openpty(&reader, &writer, nullptr, nullptr, nullptr) != 0) return "no pty";
  termios t{};
  tcgetattr(writer, &t);
  cfmakeraw(&t);
  tcsetattr(writer, TCSANOW, &t);
  std::FILE* out = fdopen(writer, "w");
  {
    ProgressLine line(out, 10);
    for (int step = 1; step <= 3; ++step) {
      StepStats s;
      s.step = step;
      s.total_steps = 3;
      s.loss = 5.0 - step;
      line.update(s);
    }
  }
  std::fflush(out);
  fcntl(reader, F_SETFL, O_NONBLOCK);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(reader, buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  std::fclose(out);
  close(reader);
  return text;
}

TEST(ProgressLine, RedrawsOneLineOnATerminal) {
  unsetenv("OMPI_COMM_WORLD_SIZE");
  const std::string text = three_steps_on_a_terminal();
  ASSERT_NE(text, "no pty");
  EXPECT_NE(text.find("\r\033[Kstep     2/3"), std::string::npos) << text;
  EXPECT_NE(text.find("\r\033[Kstep     3/3"), std::string::npos) << text;
}

TEST(ProgressLine, PrintsLinesForARankUnderMpirun) {
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  const std::string text = three_steps_on_a_terminal();
  unsetenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_NE(text, "no pty");
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(text.find("\033[K"), std::string::npos) << text;
  // Every `every` (10) steps, the first and the last: steps 1 and 3, each on its own line.
  EXPECT_NE(text.find("step     1/3"), std::string::npos) << text;
  EXPECT_EQ(text.find("step     2/3"), std::string::npos) << text;
  EXPECT_NE(text.find("step     3/3 | loss 2.0000"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace tessera::train
