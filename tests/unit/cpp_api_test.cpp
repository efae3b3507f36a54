// The C++ API in a one-process world (no launcher): RAII, spans, errors as exceptions.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "ddl/ddl.hpp"

TEST_CASE("the C++ API works in a single-process world") {
  ::unsetenv("DDL_STORE_ADDR");
  ::setenv("DDL_BOOTSTRAP", "single", 1);
  {
    ddl::Context ddl;
    CHECK(ddl.rank() == 0);
    CHECK(ddl.size() == 1);
    std::vector<float> v{1.5f, -2.0f};
    ddl.allreduce("v", std::span(v), DDL_AVERAGE);
    CHECK(v == std::vector<float>{1.5f, -2.0f});
    ddl::Handle h = ddl.allreduce_async("w", std::span(v));
    h.wait();
    std::vector<int64_t> mine{7, 8};
    CHECK(ddl.allgather("g", std::span<const int64_t>(mine)) == mine);
    ddl.barrier();
  }
  CHECK_FALSE(ddl_is_initialized());
  std::vector<float> v(1);
  CHECK_THROWS_AS(ddl::check(ddl_allreduce("x", v.data(), v.data(), 1, DDL_FLOAT32, DDL_SUM)), ddl::Failure);
  CHECK(std::string(ddl_last_error()).find("ddl_init") != std::string::npos);
  ::unsetenv("DDL_BOOTSTRAP");
}

TEST_CASE("a Context made inside another leaves the world to the outer one; alltoall wants whole blocks") {
  ::unsetenv("DDL_STORE_ADDR");
  ::setenv("DDL_BOOTSTRAP", "single", 1);
  {
    ddl::Context outer;
    { ddl::Context inner; }  // a library's own, say
    std::vector<float> v{2.0f};
    CHECK_NOTHROW(outer.allreduce("after.inner", std::span(v)));
    std::vector<int16_t> three{1, 2, 3};
    CHECK(outer.alltoall("a2a", std::span<const int16_t>(three)) == three);  // one rank: one block of 3
  }
  CHECK_FALSE(ddl_is_initialized());
  ::unsetenv("DDL_BOOTSTRAP");
}

TEST_CASE("bad arguments are errors with a message, not crashes") {
  ::setenv("DDL_BOOTSTRAP", "single", 1);
  ddl::Context ddl;
  float x = 0;
  CHECK(ddl_allreduce("x", &x, &x, 1, static_cast<ddl_dtype>(42), DDL_SUM) == DDL_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ddl_last_error()) == "unknown dtype 42");
  CHECK(ddl_broadcast("b", &x, 1, DDL_FLOAT32, 3) == DDL_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ddl_last_error()) == "broadcast root 3 is not a rank of a world of 1");
  CHECK(ddl_allreduce("n", nullptr, nullptr, 4, DDL_FLOAT32, DDL_SUM) == DDL_ERROR_INVALID_ARGUMENT);
  size_t counts[1] = {4};
  float out[4];
  CHECK(ddl_allgatherv("v", nullptr, 4, out, counts, DDL_FLOAT32) == DDL_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ddl_last_error()) == "allgatherv: the send buffer is NULL");
  bool flags[2] = {true, false};
  CHECK(ddl_allreduce("bools", flags, flags, 2, DDL_BOOL, DDL_MAX) == DDL_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ddl_last_error()) == "bool is moved only (broadcast, allgather, alltoall), not reduced");
  bool gathered[2] = {};
  CHECK(ddl_allgather("bools.moved", flags, gathered, 2, DDL_BOOL) == DDL_SUCCESS);
  CHECK((gathered[0] && !gathered[1]));
  // NCCL cannot scale: scales on CUDA buffers are refused rather than silently dropped.
  ddl_op_options cuda = DDL_OP_OPTIONS_INIT;
  cuda.flags = DDL_CUDA_BUFFERS;
  cuda.prescale = 0.5;
  ddl_handle h = nullptr;
  CHECK(ddl_allreduce_ex("scaled", &x, &x, 1, DDL_FLOAT32, DDL_SUM, &cuda, &h) == DDL_ERROR_UNSUPPORTED);
  CHECK(std::string(ddl_last_error()).find("prescale and postscale apply to host buffers") != std::string::npos);
  ::unsetenv("DDL_BOOTSTRAP");
}

// Cast to int, DDL_RANK=4294967296 would be rank 0: a second rank 0 that no check sees.
TEST_CASE("rank and placement variables out of range fail ddl_init, naming them") {
  ::setenv("DDL_BOOTSTRAP", "store", 1);
  ::setenv("DDL_STORE_ADDR", "127.0.0.1:1", 1);  // never reached: the variables are checked first
  ::setenv("DDL_SIZE", "2", 1);
  ::setenv("DDL_RANK", "4294967296", 1);
  CHECK(ddl_init() != DDL_SUCCESS);
  CHECK(std::string(ddl_last_error()).find("DDL_RANK='4294967296' is out of range") != std::string::npos);
  ::setenv("DDL_RANK", "1", 1);
  ::setenv("DDL_LOCAL_RANK", "2", 1);
  ::setenv("DDL_LOCAL_SIZE", "2", 1);
  CHECK(ddl_init() != DDL_SUCCESS);
  CHECK(std::string(ddl_last_error()).find("DDL_LOCAL_RANK, DDL_LOCAL_SIZE, DDL_NODE_RANK and DDL_NUM_NODES are out of range") !=
        std::string::npos);
  CHECK_FALSE(ddl_is_initialized());
  for (const char* name : {"DDL_BOOTSTRAP", "DDL_STORE_ADDR", "DDL_SIZE", "DDL_RANK", "DDL_LOCAL_RANK", "DDL_LOCAL_SIZE"}) ::unsetenv(name);
}

TEST_CASE("the library's version is the header's") {
  CHECK(std::string(ddl_version()) ==
        std::to_string(DDL_VERSION_MAJOR) + "." + std::to_string(DDL_VERSION_MINOR) + "." + std::to_string(DDL_VERSION_PATCH));
}
