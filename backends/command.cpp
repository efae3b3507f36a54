#include "backends/command.hpp"

#include <future>
#include <iterator>
#include <mutex>
#include <sstream>

#include <boost/asio/io_context.hpp>
#include <boost/process.hpp>

namespace ddl::backends {

namespace bp = boost::process;

namespace {
// Boost.Process (1.74) makes a child's pipes without close-on-exec, and the parent closes the
// child's ends only after the fork. A child that another thread forks meanwhile inherits those
// write ends, and the first child's output then never ends while the second lives: check-build's
// probes run at once, and a hanging `import tensorflow` would make a broken `import horovod` time out
// too. Children are therefore started one at a time; they still run at once.
std::mutex g_starting_a_child;
}  // namespace

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string last_line(const std::string& text) {
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) last = line;
  return last;
}

bool on_path(const std::string& program) { return !bp::search_path(program).empty(); }

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout, const std::string& input) {
  CommandResult result;
  if (argv.empty()) return result;
  const auto exe = argv.front().find('/') == std::string::npos ? bp::search_path(argv.front()) : boost::filesystem::path(argv.front());
  if (exe.empty()) {
    result.err = argv.front() + ": not found on PATH";
    return result;
  }
  try {
    boost::asio::io_context io;
    std::future<std::string> out, err;
    std::vector<std::string> args(argv.begin() + 1, argv.end());
    std::unique_lock starting(g_starting_a_child);
    bp::child child(exe, bp::args(args), bp::std_in<bp::buffer(input), bp::std_out> out, bp::std_err > err, io);
    starting.unlock();
    // Reading both streams and the exit happens on `io`; run it with the deadline.
    io.run_for(timeout);
    if (!io.stopped()) {
      child.terminate();
      result.timed_out = true;
      result.err = argv.front() + ": timed out";
      return result;
    }
    child.wait();
    result.exit_code = child.exit_code();
    result.out = out.get();
    result.err = err.get();
  } catch (const std::exception& e) {
    result.exit_code = -1;
    result.err = argv.front() + ": " + e.what();
  }
  return result;
}

}  // namespace ddl::backends
