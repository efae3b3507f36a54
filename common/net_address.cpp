#include "common/net_address.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/error.hpp"

namespace ddl {

std::string address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;  // the store and Gloo listen on IPv4
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0)
    throw Error(fmt::format("host {} does not resolve: {}", host, ::gai_strerror(rc)),
                "check its name (/etc/hosts, DNS) or give its address");
  // Connecting a UDP socket sends nothing; it only picks the route, and so the local address.
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t size = sizeof local;
  const bool routed = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &size) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (!routed) throw Error(fmt::format("no route to host {}: {}", host, std::strerror(err)), "check the host's name and the network");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

}  // namespace ddl
