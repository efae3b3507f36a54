// What `ddl run` serves its workers from its own process, on every path (one machine, -H hosts, an
// allocation's task launcher): the rendezvous store with the run's fresh token, and MASTER_PORT
// reserved free on this host. Made once the plan is known, before any worker starts; both live
// until the run ends.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "launcher/port_reservation.hpp"
#include "launcher/run_job.hpp"
#include "launcher/store_server.hpp"
#include "launcher/worker_environment.hpp"

namespace ddl::launcher {

// The run's identity from the request: DDL_RUN_ID ("ddl-" and the tag every restart keeps) and the
// restart counts torchrun's variables carry.
RunContext run_context(const RunRequest& request);

class RunServices {
 public:
  // The store listens on `bind_host` ("127.0.0.1" when every worker runs here, "0.0.0.0" when
  // workers on other hosts reach it) and is reached at `reach_host`; raises the open-file limit
  // first (the store holds a connection per worker).
  RunServices(const std::string& bind_host, const std::string& reach_host, const std::function<void(const std::string&)>& log);

  const std::string& store_token() const { return token_; }
  std::string store_addr() const;  // reach_host:port
  uint16_t master_port() const { return master_port_.port(); }
  // The run's context with these services (store, token, MASTER_PORT) filled in, over `run`.
  RunContext serve(RunContext run) const;
  // Says, through the log, how many connections the store turned away without the token (one is
  // a port scan's; more are worth a line).
  void report_rejections() const;

 private:
  std::function<void(const std::string&)> log_;
  std::string reach_host_;
  std::string token_;
  StoreServer store_;
  PortReservation master_port_;
};

}  // namespace ddl::launcher
