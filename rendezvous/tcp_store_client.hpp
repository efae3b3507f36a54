// Client of the rendezvous store that `ddl run` hosts (launcher/store_server). libddl uses it to
// bootstrap; tests and benchmarks use it directly. Every call has a deadline; a call that cannot
// finish by then throws ddl::Error naming the call and the key.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddl::store {

class TcpStoreClient {
 public:
  // Connects to "host:port" (or "[v6]:port"), retrying with exponential backoff until `timeout`
  // has passed, then authenticates with `token`. `timeout` also bounds every later call.
  TcpStoreClient(const std::string& address, const std::string& token, std::chrono::milliseconds timeout);
  // Reads DDL_STORE_ADDR, DDL_STORE_TOKEN and DDL_TIMEOUT (seconds, default 300).
  static TcpStoreClient from_environment();

  TcpStoreClient(TcpStoreClient&& other) noexcept;
  TcpStoreClient& operator=(TcpStoreClient&&) = delete;
  TcpStoreClient(const TcpStoreClient&) = delete;
  ~TcpStoreClient();

  void set(const std::string& key, const std::string& value);
  // Waits until `key` exists (up to the timeout), then returns its value.
  std::string get(const std::string& key);
  // The value of `key` now, or nullopt when it is not set.
  std::optional<std::string> try_get(const std::string& key);
  // Atomically adds `delta` to the integer stored at `key` (absent counts as 0); returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  // Waits until every key exists; throws when `timeout` passes first.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  // Deletes `key`; returns whether it existed.
  bool remove(const std::string& key);
  // Returns when `count` participants have called barrier(name, count).
  void barrier(const std::string& name, int64_t count);

 private:
  std::string call(const std::string& request, const char* what, const std::string& key, std::chrono::steady_clock::time_point deadline,
                   uint8_t* status);

  int fd_ = -1;
  std::string address_;
  std::chrono::milliseconds timeout_;
};

// Splits "host:port" / "[v6]:port"; throws ddl::Error naming `what` when malformed.
std::pair<std::string, uint16_t> parse_host_port(const std::string& address, const char* what);

}  // namespace ddl::store
