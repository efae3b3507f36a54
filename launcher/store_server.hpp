// The rendezvous store that `ddl run` hosts for its workers: a key-value server on one thread,
// driven by epoll, so one launcher holds thousands of concurrent clients. Operations: set, get,
// add (atomic counter), wait for keys (with a timeout), delete. Every connection must present the
// run's token first; see rendezvous/store_protocol.hpp for the wire format.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace ddl::launcher {

struct StoreServerOptions {
  std::string bind_host = "127.0.0.1";             // "0.0.0.0" when workers on other nodes must reach it
  std::string token;                               // the secret every client must present first
  std::chrono::milliseconds auth_timeout{30'000};  // a silent unauthenticated connection is closed
  std::function<void(const std::string&)> log;     // where the server reports problems; may be empty
};

class StoreServer {
 public:
  // Listens on a free port of bind_host and starts serving on a background thread.
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();  // stops the thread and closes every connection
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const { return port_; }
  // Connections closed without the right token: a wrong first message, the auth timeout, or room
  // made for a new client when the launcher ran out of file descriptors.
  uint64_t rejected_connections() const { return rejected_->load(); }

 private:
  class Loop;
  uint16_t port_ = 0;
  std::shared_ptr<std::atomic<uint64_t>> rejected_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace ddl::launcher
