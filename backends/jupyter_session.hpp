// `ddl jupyter`: a Jupyter server on a compute node, done safely. The job script's last lines
// (jupyter_body) read a fresh token from a mode-600 file into JUPYTER_TOKEN (never a command
// line), take a port the kernel hands out on the node (bind port 0) and start Jupyter on it with
// --port-retries=0, bound to the node's host name, after writing "host port" to a mode-600 file.
// Sessions live in the user's own state directory, mode 700.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/jobs.hpp"

namespace ddl::backends {

struct JupyterSession {
  std::string name;   // "jupyter-<hex>": the prefix of its files
  std::string dir;    // the sessions directory
  std::string token;  // at least 128 random bits, hex
  std::string job;    // the scheduler's job id, once submitted
  std::string site;
  Scheduler scheduler = Scheduler::Slurm;
  std::string login_host;  // where the laptop's ssh goes
  std::string jump_host;   // ssh -J, when the site needs one
  std::string user;
  std::string program;  // lab, notebook or server

  std::string token_path() const { return dir + "/" + name + ".token"; }
  std::string endpoint_path() const { return dir + "/" + name + ".endpoint"; }
};

struct JupyterEndpoint {
  std::string host;
  int port = 0;
};

// $XDG_STATE_HOME/ddl/jupyter, or ~/.local/state/ddl/jupyter; created mode 700.
std::string jupyter_sessions_dir();
// Where that folder is ($XDG_STATE_HOME/ddl/jupyter), made or not (a dry run shows it, makes nothing).
std::string jupyter_sessions_path();

// A new session with a fresh token, written to its mode-600 token file.
JupyterSession new_jupyter_session(const std::string& program);

// The script lines that start the server; `environment` is a conda environment name or the path
// of a virtualenv (empty: none), where a leading `~/` is $HOME's.
std::vector<std::string> jupyter_body(const JupyterSession& session, const std::string& environment);

// Throws UsageError when `environment` (--env) starts with '-': `source` or `conda activate` would
// read it as an option.
void check_jupyter_environment(const std::string& environment);

// Writes <dir>/<job>.json (mode 600) so `tunnel` and `stop` find the session by job id.
void save_jupyter_session(const JupyterSession& session);
// Reads it back; throws UsageError naming the job when there is none.
JupyterSession load_jupyter_session(const std::string& job);
// Removes the session's files.
void remove_jupyter_session(const JupyterSession& session);

// Where the server listens, once the job has written it.
std::optional<JupyterEndpoint> jupyter_endpoint(const JupyterSession& session);

// Follows the job until the server accepts connections (returns where), the job ends, `timeout`
// passes, or `interrupted` says so (all three throw ddl::Error). `on_change` gets every change of
// the job's state.
JupyterEndpoint wait_for_jupyter(const JupyterSession& session, std::chrono::seconds timeout,
                                 const std::function<void(const JobState&)>& on_change, const std::function<bool()>& interrupted);

// ssh -N -L LPORT:HOST:PORT [-J JUMP] USER@LOGIN
std::string ssh_tunnel_command(const JupyterSession& session, const JupyterEndpoint& at, int local_port);
// http://localhost:LPORT/?token=... (/lab for JupyterLab)
std::string jupyter_url(const JupyterSession& session, int local_port);

}  // namespace ddl::backends
