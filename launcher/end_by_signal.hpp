// Ending ddl's own process the way a program killed by a signal ends, so that its parent sees the
// signal and not an exit code: a shell running ddl in a loop stops at Ctrl-C (a loop goes on after
// a child that exited with 130, taking it to have handled the SIGINT).
#pragma once

namespace ddl::launcher {

// Ends this process by `sig` (its default action, unblocked, without a core file of ddl's own);
// exits with 128 + sig if that signal's default is not to end the process.
[[noreturn]] void end_by_signal(int sig);

}  // namespace ddl::launcher
