// A TCP port that was free when chosen and stays reserved for the run: the socket that found it
// stays bound (SO_REUSEADDR, never listening) until the run ends. The kernel never hands a port
// that a socket is bound to to another bind(port 0), so two `ddl run` on one node cannot get the
// same MASTER_PORT, while PyTorch's TCPStore (which also sets SO_REUSEADDR) can still listen on it.
#pragma once

#include <cstdint>

namespace ddl::launcher {

class PortReservation {
 public:
  PortReservation();  // binds a free port on all interfaces; throws ddl::Error when none is free
  ~PortReservation();
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;

  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

}  // namespace ddl::launcher
