// ddl run --preflight: the probes' verdict lines and what a run's probes found, host by host.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "launcher/preflight.hpp"

using namespace ddl::launcher;

TEST_CASE("a probe's verdict: ok or failed, its host and detail; other lines are the program's") {
  const auto ok = probe_verdict("something else\nddl-preflight: ok on nid001: a CUDA context on GPU 2, libddl loads\n");
  REQUIRE(ok);
  CHECK(ok->ok);
  CHECK(ok->host == "nid001");
  CHECK(ok->detail == "a CUDA context on GPU 2, libddl loads");
  const auto failed = probe_verdict("ddl-preflight: failed on nid002: GPU 0: cuInit returned CUDA_ERROR_ECC_UNCORRECTABLE");
  REQUIRE(failed);
  CHECK_FALSE(failed->ok);
  CHECK(failed->host == "nid002");
  CHECK(failed->detail == "GPU 0: cuInit returned CUDA_ERROR_ECC_UNCORRECTABLE");
  CHECK_FALSE(probe_verdict(""));
  CHECK_FALSE(probe_verdict("ddl-preflight: maybe on nid003: x\nddl-preflight: ok on nid003\n"));
}

TEST_CASE("what the probes found: hosts that passed, the first reason of each host that failed, ranks that said nothing") {
  std::string dir = (std::filesystem::temp_directory_path() / "ddl-preflight-test-XXXXXX").string();
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(dir + "/" + name) << text; };
  write("rank.0.out", "ddl-preflight: ok on a: libddl loads\n");
  write("rank.1.out", "ddl-preflight: ok on a: libddl loads\n");
  write("rank.2.out", "ddl-preflight: failed on b: GPU 0: no GPU is visible\n");
  write("rank.3.out", "ddl-preflight: failed on b: libddl does not load\n");
  write("rank.4.out", "");
  write("rank.4.err", "ddl-preflight: ok on c: stderr is not read\n");
  write("rank.x.out", "ddl-preflight: ok on d: not a rank's file\n");
  const PreflightFindings found = read_probe_outputs(dir);
  CHECK(found.ranks_passed == 2);
  CHECK(found.hosts_passed == std::vector<std::string>{"a"});
  CHECK(found.failed_hosts == std::map<std::string, std::string>{{"b", "GPU 0: no GPU is visible"}});
  CHECK(found.ranks_unheard == std::vector<int>{4});
  std::filesystem::remove_all(dir);
}
