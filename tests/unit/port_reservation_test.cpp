#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <vector>

#include "launcher/port_reservation.hpp"

using ddl::launcher::PortReservation;

TEST_CASE("reserved ports are distinct while held") {
  std::vector<std::unique_ptr<PortReservation>> held;
  std::set<uint16_t> ports;
  for (int i = 0; i < 200; ++i) {
    held.push_back(std::make_unique<PortReservation>());
    ports.insert(held.back()->port());
  }
  CHECK(ports.size() == 200);
}

TEST_CASE("a program can listen on the reserved port the way PyTorch's TCPStore does (SO_REUSEADDR)") {
  PortReservation reservation;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(reservation.port());
  CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  CHECK(::listen(fd, 16) == 0);
  ::close(fd);
}
