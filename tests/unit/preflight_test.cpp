// ddl run --preflight: the probes' verdict lines and what a run's probes found, host by host.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "launcher/preflight.hpp"

using namespace ddl::launcher;

TEST_CASE("a probe's verdict: ok or failed, its host and detail; other lines are the program's") {
  const auto ok = probe_verdict("something else\nddl-preflight: ok on nid001 [node 3]: a CUDA context on GPU 2, libddl loads\n");
  REQUIRE(ok);
  CHECK(ok->ok);
  CHECK(ok->host == "nid001");
  CHECK(ok->node == 3);
  CHECK(ok->detail == "a CUDA context on GPU 2, libddl loads");
  const auto failed = probe_verdict("ddl-preflight: failed on nid002 [node ?]: GPU 0: cuInit returned CUDA_ERROR_ECC_UNCORRECTABLE");
  REQUIRE(failed);
  CHECK_FALSE(failed->ok);
  CHECK(failed->host == "nid002");
  CHECK(failed->node == -1);
  CHECK(failed->detail == "GPU 0: cuInit returned CUDA_ERROR_ECC_UNCORRECTABLE");
  CHECK_FALSE(probe_verdict(""));
  CHECK_FALSE(probe_verdict("ddl-preflight: maybe on nid003 [node 0]: x\nddl-preflight: ok on nid003\nddl-preflight: ok on nid003: x\n"));
}

TEST_CASE("what the probes found: hosts that passed, the first reason of each host that failed, ranks that said nothing") {
  std::string dir = (std::filesystem::temp_directory_path() / "ddl-preflight-test-XXXXXX").string();
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(dir + "/" + name) << text; };
  struct Removed {
    std::string dir;
    ~Removed() { std::filesystem::remove_all(dir); }
  } removed{dir};
  write("rank.0.out", "ddl-preflight: ok on a [node 0]: libddl loads\n");
  write("rank.1.out", "ddl-preflight: ok on a [node 0]: libddl loads\n");
  write("rank.2.out", "ddl-preflight: failed on b [node 1]: GPU 0: no GPU is visible\n");
  write("rank.3.out", "ddl-preflight: failed on b [node 1]: libddl does not load\n");
  write("rank.4.out", "");
  write("rank.4.err", "ddl-preflight: ok on c [node 2]: stderr is not read\n");
  write("rank.x.out", "ddl-preflight: ok on d [node 3]: not a rank's file\n");
  const PreflightFindings found = read_probe_outputs(dir, nullptr);
  CHECK(found.ranks_passed == 2);
  CHECK(found.hosts_passed == std::vector<std::string>{"a"});
  CHECK(found.failed_hosts == std::map<std::string, std::string>{{"b", "GPU 0: no GPU is visible"}});
  CHECK(found.ranks_unheard == std::vector<int>{4});
  // -H's names for the nodes (an address, an ssh alias), where the run knows them.
  const std::vector<std::string> named{"10.0.0.1", "gpu-b"};
  const PreflightFindings by_name = read_probe_outputs(dir, [&](const ProbeVerdict& v) { return named.at(static_cast<size_t>(v.node)); });
  CHECK(by_name.hosts_passed == std::vector<std::string>{"10.0.0.1"});
  CHECK(by_name.failed_hosts == std::map<std::string, std::string>{{"gpu-b", "GPU 0: no GPU is visible"}});
}
