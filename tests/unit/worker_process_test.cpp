// Signalling workers: launcher/worker_process.hpp.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher/supervisor.hpp"
#include "launcher/worker_process.hpp"

using ddl::launcher::signal_unreaped_worker;

TEST_SUITE("worker_process") {
  TEST_CASE("a signal reaches a worker forked a moment ago, before it has a process group of its own") {
    // Like spawn_worker's child before its setsid(): in ddl's process group, with SIGTERM blocked
    // (inherited) until just before exec. ddl stopping the run at that moment must not miss it.
    sigset_t term, original;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    REQUIRE(::pthread_sigmask(SIG_BLOCK, &term, &original) == 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::signal(SIGTERM, SIG_DFL);  // not doctest's handler, inherited: SIGTERM must end the child as it would a worker
      const timespec a_while{0, 200'000'000};
      ::nanosleep(&a_while, nullptr);
      ::sigprocmask(SIG_UNBLOCK, &term, nullptr);  // a pending SIGTERM ends it here
      ::_exit(0);
    }
    ::pthread_sigmask(SIG_SETMASK, &original, nullptr);
    REQUIRE(pid > 0);
    CHECK(signal_unreaped_worker(pid, SIGTERM));
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGTERM);
  }

  TEST_CASE("a worker whose start failed is never signalled: kill(-(-1)) would reach init") {
    CHECK_FALSE(signal_unreaped_worker(-1, 0));
    CHECK_FALSE(signal_unreaped_worker(0, 0));
  }

  TEST_CASE("a worker that made its own session gets the signal in its whole group") {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::signal(SIGTERM, SIG_DFL);  // not doctest's handler (the grandchild inherits this too)
      ::setsid();
      const pid_t grandchild = ::fork();  // a process the worker started, in its group
      if (grandchild == 0) {
        ::pause();
        ::_exit(0);
      }
      ::signal(SIGTERM, SIG_IGN);  // the worker outlives the signal, to report on the grandchild
      const char byte = 1;
      (void)!::write(ready[1], &byte, 1);
      int status = 0;
      ::waitpid(grandchild, &status, 0);
      ::_exit(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM ? 42 : 1);
    }
    REQUIRE(pid > 0);
    ::close(ready[1]);
    char byte = 0;
    REQUIRE(::read(ready[0], &byte, 1) == 1);
    ::close(ready[0]);
    CHECK(signal_unreaped_worker(pid, SIGTERM));
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 42);  // the grandchild died of SIGTERM
  }

  // ddl run -H looks up every host name with the signals already blocked, so each lookup is followed
  // by this check: otherwise Ctrl-C would wait for all the lookups (minutes for thousands of names).
  TEST_CASE("a stopping signal that comes before the run is seen; one meant for workers is dropped") {
    ddl::launcher::Supervisor supervisor({});
    CHECK(supervisor.signal_before_run() == 0);
    REQUIRE(::raise(SIGUSR1) == 0);  // blocked: pending, not doctest's handler
    CHECK(supervisor.signal_before_run() == 0);
    REQUIRE(::raise(SIGTERM) == 0);
    CHECK(supervisor.signal_before_run() == SIGTERM);
    CHECK(supervisor.signal_before_run() == 0);
  }
}
