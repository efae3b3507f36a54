#include "launcher/end_by_signal.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace ddl::launcher {

void end_by_signal(int sig) {
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  ::signal(sig, SIG_DFL);
  sigset_t just_sig;
  sigemptyset(&just_sig);
  sigaddset(&just_sig, sig);
  ::sigprocmask(SIG_UNBLOCK, &just_sig, nullptr);
  ::raise(sig);
  ::_exit(128 + sig);
}

namespace {

bool parent_is_salloc() {
  std::ifstream comm("/proc/" + std::to_string(::getppid()) + "/comm");
  std::string name;
  return std::getline(comm, name) && name == "salloc";
}

}  // namespace

int run_exit_code_or_end(const RunOutcome& outcome) {
  if (outcome.interrupted_by != SIGINT || parent_is_salloc()) return outcome.exit_code;
  std::fflush(nullptr);
  end_by_signal(SIGINT);
}

}  // namespace ddl::launcher
