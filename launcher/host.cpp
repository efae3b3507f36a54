#include "launcher/host.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <set>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/net_address.hpp"

namespace ddl::launcher {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::string this_executable() {
  char path[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw Error("cannot find ddl's own executable (/proc/self/exe)");
  return std::string(path, static_cast<size_t>(n));
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

namespace {

// The IPv4 and IPv6 addresses `name` resolves to, as text; empty when it does not resolve.
std::set<std::string> addresses_of(const std::string& name) {
  std::set<std::string> out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) return out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) out.insert(text);
  }
  ::freeaddrinfo(found);
  return out;
}

std::set<std::string> interface_addresses() {
  std::set<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    const socklen_t size = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    char text[INET6_ADDRSTRLEN] = {};
    if (::getnameinfo(i->ifa_addr, size, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) out.insert(text);
  }
  ::freeifaddrs(list);
  return out;
}

bool is_loopback(const std::string& address) { return address.starts_with("127.") || address == "::1"; }

}  // namespace

bool is_this_host(const std::string& name) {
  const std::string me = host_name();
  if (name == "localhost" || name == me || name == me.substr(0, me.find('.'))) return true;
  const std::set<std::string> mine = interface_addresses();
  for (const std::string& address : addresses_of(name))
    if (is_loopback(address) || mine.count(address)) return true;
  return false;
}

void raise_open_file_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// The canonical name of this host (its short name resolved with AI_CANONNAME), which site
// profiles match ("nid001234.perlmutter.nersc.gov"); the short name when it does not resolve.
std::string full_host_name() {
  const std::string short_name = host_name();
  addrinfo hints{};
  hints.ai_flags = AI_CANONNAME;
  addrinfo* found = nullptr;
  std::string full = short_name;
  if (::getaddrinfo(short_name.c_str(), nullptr, &hints, &found) == 0) {
    if (found != nullptr && found->ai_canonname != nullptr) full = found->ai_canonname;
    ::freeaddrinfo(found);
  }
  return full;
}

}  // namespace ddl::launcher
