#include "launcher/end_by_signal.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

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

}  // namespace ddl::launcher
