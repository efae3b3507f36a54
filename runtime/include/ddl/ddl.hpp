// The C++ API of libddl: RAII and std::span over the C API of ddl/ddl.h (read it for the semantics).
//
//   ddl::Context ddl;                      // ddl_init(); ddl_finalize() when it goes out of scope
//   std::vector<float> grad(n);
//   ddl.allreduce("grad/w1", std::span(grad), DDL_AVERAGE);           // in place, blocking
//   ddl::Handle h = ddl.allreduce_async("grad/w2", std::span(g2));    // ... later: h.wait();
//
// Failures throw ddl::Failure, which carries the ddl_status and ddl_last_error()'s message.
#ifndef DDL_DDL_HPP
#define DDL_DDL_HPP

#if __cplusplus < 202002L
#error "ddl/ddl.hpp needs C++20 (std::span): compile with -std=c++20, or use the C API of ddl/ddl.h"
#endif

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddl/ddl.h"

namespace ddl {

class Failure : public std::runtime_error {
 public:
  Failure(ddl_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  ddl_status status() const noexcept { return status_; }

 private:
  ddl_status status_;
};

inline void check(ddl_status status) {
  if (status != DDL_SUCCESS) throw Failure(status, ddl_last_error());
}

// The ddl_dtype of a C++ element type. Use std::uint16_t with an explicit dtype for 16-bit floats.
template <typename T>
constexpr ddl_dtype dtype_of();
template <>
constexpr ddl_dtype dtype_of<float>() {
  return DDL_FLOAT32;
}
template <>
constexpr ddl_dtype dtype_of<double>() {
  return DDL_FLOAT64;
}
template <>
constexpr ddl_dtype dtype_of<std::int32_t>() {
  return DDL_INT32;
}
template <>
constexpr ddl_dtype dtype_of<std::int64_t>() {
  return DDL_INT64;
}
template <>
constexpr ddl_dtype dtype_of<std::uint8_t>() {
  return DDL_UINT8;
}
template <>
constexpr ddl_dtype dtype_of<std::int8_t>() {
  return DDL_INT8;
}
template <>
constexpr ddl_dtype dtype_of<std::int16_t>() {
  return DDL_INT16;
}
// Moved only (broadcast, allgather, alltoall): reductions refuse them.
template <>
constexpr ddl_dtype dtype_of<bool>() {
  return DDL_BOOL;
}
template <>
constexpr ddl_dtype dtype_of<std::uint32_t>() {
  return DDL_UINT32;
}
template <>
constexpr ddl_dtype dtype_of<std::uint64_t>() {
  return DDL_UINT64;
}

// An operation in flight. wait() rethrows its failure; destroying an unwaited handle waits.
class Handle {
 public:
  explicit Handle(ddl_handle h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      release();
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { release(); }

  void wait() {
    ddl_handle h = h_;
    h_ = nullptr;
    if (h != nullptr) check(ddl_wait(h));
  }
  bool test() const {
    int done = 1;
    if (h_ != nullptr) check(ddl_test(h_, &done));
    return done != 0;
  }

 private:
  void release() noexcept {
    if (h_ != nullptr) ddl_wait(h_);
    h_ = nullptr;
  }
  ddl_handle h_;
};

// The world this process belongs to, for the lifetime of the object. The Context that initialized
// libddl finalizes it; one made while libddl was already initialized (by ddl_init or another
// Context) leaves the world to whoever initialized it.
class Context {
 public:
  Context() : initialized_here_(ddl_is_initialized() == 0) { check(ddl_init()); }
  ~Context() {
    if (initialized_here_) ddl_finalize();
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return get(ddl_rank); }
  int size() const { return get(ddl_size); }
  int local_rank() const { return get(ddl_local_rank); }
  int local_size() const { return get(ddl_local_size); }
  int node_rank() const { return get(ddl_node_rank); }

  template <typename T>
  void allreduce(const std::string& name, std::span<T> data, ddl_reduce_op op = DDL_SUM, ddl_dtype dtype = dtype_of<T>()) {
    check(ddl_allreduce(name.c_str(), data.data(), data.data(), data.size(), dtype, op));
  }
  template <typename T>
  Handle allreduce_async(const std::string& name, std::span<T> data, ddl_reduce_op op = DDL_SUM, ddl_dtype dtype = dtype_of<T>()) {
    ddl_handle h = nullptr;
    check(ddl_allreduce_async(name.c_str(), data.data(), data.data(), data.size(), dtype, op, &h));
    return Handle(h);
  }
  template <typename T>
  void broadcast(const std::string& name, std::span<T> data, int root, ddl_dtype dtype = dtype_of<T>()) {
    check(ddl_broadcast(name.c_str(), data.data(), data.size(), dtype, root));
  }
  // Every rank's `mine`, concatenated in rank order.
  template <typename T>
  std::vector<T> allgather(const std::string& name, std::span<const T> mine, ddl_dtype dtype = dtype_of<T>()) {
    std::vector<T> all(mine.size() * static_cast<size_t>(size()));
    check(ddl_allgather(name.c_str(), mine.data(), all.data(), mine.size(), dtype));
    return all;
  }
  // Block j of `send` goes to rank j; block j of the result came from rank j. `send` holds size()
  // blocks of equal length: any other length throws a Failure (DDL_ERROR_INVALID_ARGUMENT).
  template <typename T>
  std::vector<T> alltoall(const std::string& name, std::span<const T> send, ddl_dtype dtype = dtype_of<T>()) {
    if (send.size() % static_cast<size_t>(size()) != 0)
      throw Failure(DDL_ERROR_INVALID_ARGUMENT, "alltoall: the input's " + std::to_string(send.size()) + " elements are not " +
                                                    std::to_string(size()) + " blocks of equal length (one per rank)");
    std::vector<T> recv(send.size());
    check(ddl_alltoall(name.c_str(), send.data(), recv.data(), send.size() / static_cast<size_t>(size()), dtype));
    return recv;
  }
  void barrier() { check(ddl_barrier()); }

 private:
  static int get(ddl_status (*fn)(int*)) {
    int value = 0;
    check(fn(&value));
    return value;
  }
  bool initialized_here_;
};

}  // namespace ddl

#endif  // DDL_DDL_HPP
