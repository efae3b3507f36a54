// ddl run's warning before a multi-node GPU run where NCCL would miss the network a matching site
// profile expects (check-build's whole section is tested with stand-in plugins in
// tests/integration/test_nccl_network.py).
#include <doctest/doctest.h>

#include "launcher/nccl_network.hpp"

using ddl::Environment;
using namespace ddl::launcher;

TEST_CASE("ddl run warns where a matching site expects OFI and no NCCL net plugin loads, and only there") {
  const Environment no_plugin{{"NCCL_NET_PLUGIN", "ddl-test-nowhere"}};
  Environment perlmutter = no_plugin;
  perlmutter["NERSC_HOST"] = "perlmutter";
  const auto warning = site_network_warning(perlmutter);
  REQUIRE(warning.has_value());
  CHECK(
      warning->starts_with("WARNING: site perlmutter expects NCCL to reach its nodes through ofi, but no NCCL net plugin loads "
                           "(libnccl-net-ddl-test-nowhere.so: cannot open shared object file"));
  CHECK(warning->find("; fix: load NERSC's NCCL with the OFI plugin") != std::string::npos);
  CHECK_FALSE(site_network_warning(no_plugin).has_value());  // no profile that expects anything matches

  Environment off = perlmutter;
  off["NCCL_NET_PLUGIN"] = "none";
  REQUIRE(site_network_warning(off).has_value());
  CHECK(site_network_warning(off)->find("NCCL_NET_PLUGIN=none turns NCCL's net plugins off") != std::string::npos);
}
