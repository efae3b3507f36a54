#include "launcher/run_services.hpp"

#include <fmt/format.h>

#include "common/random_hex.hpp"
#include "launcher/host.hpp"

namespace ddl::launcher {

namespace {

// Before the store opens its listening socket: it holds a connection per worker.
std::string token_after_raising_file_limit() {
  raise_open_file_limit();
  return random_hex(16);
}

}  // namespace

RunContext run_context(const RunRequest& request) {
  RunContext run;
  run.run_id = "ddl-" + request.run_tag;
  run.restart_count = request.restart_count;
  run.max_restarts = request.max_restarts;
  return run;
}

RunServices::RunServices(const std::string& bind_host, const std::string& reach_host, const std::function<void(const std::string&)>& log)
    : log_(log),
      reach_host_(reach_host),
      token_(token_after_raising_file_limit()),
      store_({.bind_host = bind_host, .token = token_, .log = log}) {}

std::string RunServices::store_addr() const { return fmt::format("{}:{}", reach_host_, store_.port()); }

RunContext RunServices::serve(RunContext run) const {
  run.store_addr = store_addr();
  run.store_token = token_;
  run.master_port = master_port();
  return run;
}

void RunServices::report_rejections() const {
  if (store_.rejected_connections() > 1 && log_)
    log_(fmt::format("store: rejected {} connections with a wrong or missing token in all", store_.rejected_connections()));
}

}  // namespace ddl::launcher
