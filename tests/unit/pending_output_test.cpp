#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>

#include <string>

#include "launcher/pending_output.hpp"

using namespace ddl::launcher;

namespace {

// A pipe, or a socket pair (which ddl cannot reopen non-blocking: it writes PIPE_BUF at a time).
struct Pipe {
  int read_end = -1;
  int write_end = -1;
  explicit Pipe(bool socket = false) {
    int fds[2];
    REQUIRE((socket ? ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) : ::pipe2(fds, O_CLOEXEC)) == 0);
    read_end = fds[0];
    write_end = fds[1];
  }
  ~Pipe() {
    if (read_end >= 0) ::close(read_end);
    if (write_end >= 0) ::close(write_end);
  }
  std::string read_available() const {
    std::string got;
    char buf[65536];
    pollfd p{read_end, POLLIN, 0};
    while (::poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
      ssize_t n = ::read(read_end, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
};

bool takes_more_now(int fd) {
  pollfd p{fd, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && p.revents != 0;
}

// Writes what each descriptor takes now, as the supervisor does on POLLOUT.
void write_what_is_taken(PendingOutput& output) {
  while (!output.empty() && takes_more_now(output.next_fd())) output.write_next();
}

std::string numbered_lines(int from, int to) {
  std::string text;
  for (int i = from; i < to; ++i) text += std::to_string(i) + " " + std::string(90, 'x') + "\n";
  return text;
}

}  // namespace

TEST_CASE("pending output goes out in the order it came, across descriptors, as far as each takes it") {
  Pipe out;
  Pipe err;
  PendingOutput output;
  output.add(out.write_end, "a1\n");
  output.add(err.write_end, "b1\n");
  output.add(out.write_end, "a2\n");
  CHECK(output.next_fd() == out.write_end);
  CHECK(output.bytes() == 9);
  output.write_next();
  CHECK(output.empty());
  CHECK(output.next_fd() == -1);
  CHECK(out.read_available() == "a1\na2\n");
  CHECK(err.read_available() == "b1\n");
}

TEST_CASE("what waits for a descriptor that takes no more holds back what comes after it, for any descriptor") {
  Pipe out;
  Pipe err;
  PendingOutput output;
  const std::string text = numbered_lines(0, 2000);  // more than a pipe holds
  output.add(out.write_end, text);
  output.add(err.write_end, "after\n");
  output.write_next();
  CHECK(output.next_fd() == out.write_end);
  CHECK(err.read_available().empty());
  std::string got;
  for (int round = 0; round < 1000 && !output.empty(); ++round) {
    got += out.read_available();
    write_what_is_taken(output);
  }
  got += out.read_available();
  CHECK(got == text);
  CHECK(err.read_available() == "after\n");
}

TEST_CASE("a reader that does not read never makes a write wait, and what waits goes out whole once it reads") {
  // Far more than a pipe holds: writing only what poll() says the pipe takes must never block
  // (a blocked write would hang this test), and the rest waits, counted, until the reader reads.
  bool socket = false;
  SUBCASE("a pipe") { socket = false; }
  SUBCASE("a socket") { socket = true; }
  Pipe out(socket);
  PendingOutput output(1 << 20);
  const std::string text = numbered_lines(0, 3000);  // about 280 KiB
  output.add(out.write_end, text);
  write_what_is_taken(output);
  CHECK_FALSE(output.empty());
  CHECK(output.bytes() < text.size());
  CHECK_FALSE(output.full());
  std::string got;
  for (int round = 0; round < 1000 && !output.empty(); ++round) {
    got += out.read_available();
    write_what_is_taken(output);
  }
  got += out.read_available();
  CHECK(output.empty());
  CHECK(got == text);
}

TEST_CASE("pending output is full at its limit, and not once the reader has taken some") {
  Pipe out;
  PendingOutput output(200'000);
  output.add(out.write_end, numbered_lines(0, 2500));  // about 235 KB
  CHECK(output.full());
  write_what_is_taken(output);
  CHECK_FALSE(output.full());
}

TEST_CASE("when the reader has gone, its output is dropped and the descriptor is named once") {
  ::signal(SIGPIPE, SIG_IGN);  // as the supervisor runs
  Pipe out;
  Pipe err;
  PendingOutput output;
  output.add(out.write_end, "lost\n");
  output.add(err.write_end, "kept\n");
  output.add(out.write_end, "lost too\n");
  ::close(out.read_end);
  out.read_end = -1;
  CHECK(output.write_next() == out.write_end);
  CHECK(output.next_fd() == err.write_end);
  output.add(out.write_end, "later\n");  // ignored: nobody reads it
  CHECK(output.write_next() == -1);
  CHECK(output.empty());
  CHECK(err.read_available() == "kept\n");
}

TEST_CASE("a pty's master side as the descriptor: its output reaches the slave side, not a new pty") {
  // /proc/self/fd/N of a master is /dev/ptmx, whose opening makes a new pty: it is written as it is.
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(slave >= 0);
  termios raw{};
  ::tcgetattr(slave, &raw);
  ::cfmakeraw(&raw);
  ::tcsetattr(slave, TCSANOW, &raw);
  {
    PendingOutput output;
    output.add(master, "to the slave\n");
    write_what_is_taken(output);
    CHECK(output.empty());
  }
  char buf[64] = {};
  pollfd p{slave, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 2000) == 1);
  CHECK(std::string(buf, static_cast<size_t>(::read(slave, buf, sizeof buf))) == "to the slave\n");
  ::close(slave);
  ::close(master);
}

TEST_CASE("a descriptor open for reading only: its output is dropped at once, not written into a pipe nobody reads") {
  Pipe pipe;
  PendingOutput output;
  output.add(pipe.read_end, std::string(200'000, 'x'));  // more than a pipe holds
  write_what_is_taken(output);
  CHECK(output.empty());
  CHECK(pipe.read_available().empty());
}
