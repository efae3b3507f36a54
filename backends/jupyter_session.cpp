#include "backends/jupyter_session.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/job_script.hpp"
#include "common/error.hpp"
#include "common/random_hex.hpp"

namespace ddl::backends {

namespace fs = std::filesystem;

namespace {

// Creates `path` with mode 600 (refusing to follow or reuse an existing file) and writes `text`.
void write_private_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(fmt::format("cannot create {}: {}", path, std::strerror(errno)), "check the directory's permissions");
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    throw Error(fmt::format("cannot write {}", path), "check the free space of its file system");
  }
}

std::string user_name() {
  if (const char* user = std::getenv("USER"); user != nullptr && *user != '\0') return user;
  if (const passwd* pw = ::getpwuid(::getuid())) return pw->pw_name;
  return std::to_string(::getuid());
}

bool accepts_connections(const JupyterEndpoint& at) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(at.host.c_str(), std::to_string(at.port).c_str(), &hints, &found) != 0) return false;
  bool connected = false;
  for (addrinfo* a = found; a != nullptr && !connected; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    // Non-blocking with a 2 s limit: a filtered port must not stall the wait past its timeout.
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      connected = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof error;
      connected = ::poll(&p, 1, 2000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return connected;
}

}  // namespace

std::string jupyter_sessions_path() {
  const char* state = std::getenv("XDG_STATE_HOME");
  const char* home = std::getenv("HOME");
  fs::path dir = state != nullptr && *state != '\0' ? fs::path(state) : fs::path(home != nullptr ? home : "/") / ".local" / "state";
  return (dir / "ddl" / "jupyter").string();
}

std::string jupyter_sessions_dir() {
  const fs::path dir = jupyter_sessions_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create {}: {}", dir.string(), ec.message()), "set XDG_STATE_HOME to a directory you own");
  ::chmod(dir.c_str(), 0700);  // the token and the connection details are in here
  return dir.string();
}

JupyterSession new_jupyter_session(const std::string& program) {
  JupyterSession s;
  s.name = "jupyter-" + random_hex(6);
  s.dir = jupyter_sessions_dir();
  s.token = random_hex(24);  // 192 bits
  s.user = user_name();
  s.program = program;
  write_private_file(s.token_path(), s.token);
  return s;
}

void check_jupyter_environment(const std::string& environment) {
  if (environment.starts_with('-'))
    throw UsageError(fmt::format("--env {}: starts with '-', so {} would read it as an option", environment,
                                 environment.find('/') != std::string::npos ? "source" : "conda activate"),
                     "give a conda environment's name, or a virtualenv's path as ./NAME");
}

std::vector<std::string> jupyter_body(const JupyterSession& session, const std::string& environment) {
  std::vector<std::string> lines = {"# ddl jupyter: the token comes from a mode-600 file, never a command line; the port is one the kernel",
                                    "# hands out on this node (bind port 0), and --port-retries=0 keeps Jupyter from moving to another.",
                                    "session=" + shell_quote(session.dir + "/" + session.name),
                                    // NOLINTNEXTLINE(bugprone-suspicious-missing-comma): one shell line, split in two literals
                                    "JUPYTER_TOKEN=$(cat \"$session.token\") && [ -n \"$JUPYTER_TOKEN\" ] || { echo \"ddl jupyter: cannot "
                                    "read $session.token here\" >&2; exit 1; }",
                                    "export JUPYTER_TOKEN"};
  if (!environment.empty()) {
    if (environment.find('/') != std::string::npos)
      lines.push_back("source " + shell_quote(environment + "/bin/activate"));
    else {
      lines.emplace_back("eval \"$(conda shell.bash hook)\"  # conda activate needs conda's shell functions in a batch shell");
      lines.push_back("conda activate " + shell_quote(environment));
    }
  }
  lines.emplace_back("port=$(python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])')");
  lines.emplace_back("host=$(hostname)");
  lines.emplace_back("(umask 077 && printf '%s %s\\n' \"$host\" \"$port\" > \"$session.endpoint\")");
  lines.emplace_back("as_root=(); [ \"$(id -u)\" -ne 0 ] || as_root=(--allow-root)  # Jupyter refuses root otherwise (containers, tests)");
  lines.push_back("exec jupyter " + shell_quote(session.program) +
                  " --no-browser --ip=\"$host\" --port=\"$port\" --port-retries=0 \"${as_root[@]}\"");
  return lines;
}

void save_jupyter_session(const JupyterSession& s) {
  nlohmann::json j = {{"name", s.name},
                      {"dir", s.dir},
                      {"job", s.job},
                      {"site", s.site},
                      {"scheduler", scheduler_key(s.scheduler)},
                      {"login_host", s.login_host},
                      {"jump_host", s.jump_host},
                      {"user", s.user},
                      {"program", s.program}};
  write_private_file(s.dir + "/" + s.job + ".json", j.dump(2) + "\n");
}

JupyterSession load_jupyter_session(const std::string& job) {
  if (!looks_like_job_id(job)) throw UsageError(not_a_job_id(job), "give the id ddl jupyter start printed");
  const std::string dir = jupyter_sessions_dir();
  std::ifstream in(dir + "/" + job + ".json");
  if (!in) throw UsageError(fmt::format("no ddl jupyter session for job {} in {}", job, dir), "ddl jupyter start prints the job id");
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error(fmt::format("{}/{}.json is not a ddl jupyter session", dir, job), "remove it and start a new session");
  for (const auto& [key, value] : j.items())  // ddl writes strings only: anything else was not written by ddl
    if (!value.is_string())
      throw Error(fmt::format("{}/{}.json: field '{}' is not a string, so not one ddl jupyter wrote", dir, job, key),
                  "remove it and start a new session");
  JupyterSession s;
  s.name = j.value("name", "");
  s.dir = j.value("dir", dir);
  s.job = j.value("job", job);
  s.site = j.value("site", "");
  const auto scheduler = scheduler_from_key(j.value("scheduler", "slurm"));
  if (!scheduler)
    throw Error(fmt::format("{}/{}.json: scheduler '{}' is neither slurm nor pbs", dir, job, j.value("scheduler", "")),
                "remove it and start a new session");
  s.scheduler = *scheduler;
  s.login_host = j.value("login_host", "");
  s.jump_host = j.value("jump_host", "");
  s.user = j.value("user", user_name());
  s.program = j.value("program", "lab");
  std::ifstream token(s.token_path());
  std::getline(token, s.token);
  return s;
}

void remove_jupyter_session(const JupyterSession& s) {
  std::error_code ec;
  for (const std::string& path : {s.token_path(), s.endpoint_path(), s.dir + "/" + s.job + ".json"}) fs::remove(path, ec);
}

std::optional<JupyterEndpoint> jupyter_endpoint(const JupyterSession& session) {
  std::ifstream in(session.endpoint_path());
  JupyterEndpoint at;
  if (!(in >> at.host >> at.port) || at.port <= 0) return std::nullopt;
  return at;
}

JupyterEndpoint wait_for_jupyter(const JupyterSession& session, std::chrono::seconds timeout,
                                 const std::function<void(const JobState&)>& on_change, const std::function<bool()>& interrupted) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<JobState> last;
  while (std::chrono::steady_clock::now() < deadline) {
    if (interrupted()) throw Error(fmt::format("interrupted while waiting for Jupyter of job {}", session.job));
    auto now = job_state(session.scheduler, session.job);
    if (now && shows_change(last, *now)) on_change(*now);
    if (!now || now->finished) {
      std::string output = now && !now->output.empty() ? " (its output: " + now->output + ")" : "";
      throw Error(fmt::format("job {} ended before Jupyter came up{}", session.job, output),
                  "read the job's output; `jupyter " + session.program + "` must be installed in the job's environment");
    }
    last = now;
    if (auto at = jupyter_endpoint(session); at && accepts_connections(*at)) return *at;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  throw Error(fmt::format("Jupyter of job {} was not up after {} s", session.job, timeout.count()),
              fmt::format("it keeps running: ddl jupyter tunnel {} once it is up, or ddl jupyter stop {}", session.job, session.job));
}

std::string ssh_tunnel_command(const JupyterSession& s, const JupyterEndpoint& at, int local_port) {
  std::string command = fmt::format("ssh -N -L {}:{}:{}", local_port, at.host, at.port);
  if (!s.jump_host.empty()) command += " -J " + shell_quote(s.jump_host);
  return command + " " + shell_quote(s.user + "@" + s.login_host);
}

std::string jupyter_url(const JupyterSession& s, int local_port) {
  return fmt::format("http://localhost:{}/{}?token={}", local_port, s.program == "lab" ? "lab" : "", s.token);
}

}  // namespace ddl::backends
