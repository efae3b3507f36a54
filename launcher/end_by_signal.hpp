// Ending ddl's own process the way a program killed by a signal ends, so that its parent sees the
// signal and not an exit code: a shell running ddl in a loop stops at Ctrl-C (a loop goes on after
// a child that exited with 130, taking it to have handled the SIGINT).
#pragma once

#include "launcher/supervisor.hpp"

namespace ddl::launcher {

// Ends this process by `sig` (its default action, unblocked, without a core file of ddl's own);
// exits with 128 + sig if that signal's default is not to end the process.
[[noreturn]] void end_by_signal(int sig);

// What `ddl run` exits with after `outcome`; after Ctrl-C it ends this process by SIGINT instead
// (its output flushed), except when its parent is salloc, which reports a child killed by a signal
// as exit 0: there it is 130.
int run_exit_code_or_end(const RunOutcome& outcome);

}  // namespace ddl::launcher
