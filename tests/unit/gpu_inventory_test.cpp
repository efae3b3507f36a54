#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "launcher/gpu_inventory.hpp"

using namespace ddl::launcher;

TEST_CASE("CUDA_VISIBLE_DEVICES entries are the GPUs, in order") {
  auto inv = parse_visible_devices("2,3,5,7");
  REQUIRE(inv.count() == 4);
  CHECK(gpu_for_local_rank(inv, 0) == "2");
  CHECK(gpu_for_local_rank(inv, 1) == "3");
  CHECK(gpu_for_local_rank(inv, 2) == "5");
  CHECK(gpu_for_local_rank(inv, 3) == "7");
}

TEST_CASE("CUDA_VISIBLE_DEVICES keeps UUIDs, trims blanks, and ends at a negative entry as CUDA does") {
  CHECK(parse_visible_devices("GPU-8a1b, MIG-77").ids == std::vector<std::string>{"GPU-8a1b", "MIG-77"});
  CHECK(parse_visible_devices("1,-1,2").ids == std::vector<std::string>{"1"});
  CHECK(parse_visible_devices("").count() == 0);
  CHECK(parse_visible_devices("-1").count() == 0);
  // No device by that name, or one named twice: CUDA sees the ones before it only.
  CHECK(parse_visible_devices("abc").count() == 0);
  CHECK(parse_visible_devices("0,abc,1").ids == std::vector<std::string>{"0"});
  CHECK(parse_visible_devices("0,0").ids == std::vector<std::string>{"0"});
  CHECK(parse_visible_devices("1,2,1,3").ids == std::vector<std::string>{"1", "2"});
}

TEST_CASE("an inherited CUDA_VISIBLE_DEVICES wins over what the machine has") {
  ddl::Environment env{{"CUDA_VISIBLE_DEVICES", "4,6"}};
  auto inv = discover_gpus(env);
  CHECK(inv.ids == std::vector<std::string>{"4", "6"});
  CHECK(inv.source == "CUDA_VISIBLE_DEVICES");
}

TEST_CASE("sharing GPUs assigns them round robin") {
  auto inv = parse_visible_devices("0,1");
  CHECK(gpu_for_local_rank(inv, 2) == "0");
  CHECK(gpu_for_local_rank(inv, 3) == "1");
}

namespace {
// A directory holding an `nvidia-smi` that runs `body`, first on PATH while it lives.
struct FakeNvidiaSmi {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "ddl_unit_fake_nvidia_smi";
  std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
  explicit FakeNvidiaSmi(const std::string& body) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "nvidia-smi") << "#!/bin/sh\n" << body << "\n";
    std::filesystem::permissions(dir / "nvidia-smi", std::filesystem::perms::owner_all);
    ::setenv("PATH", (dir.string() + ":" + old_path).c_str(), 1);
  }
  ~FakeNvidiaSmi() {
    ::setenv("PATH", old_path.c_str(), 1);
    std::filesystem::remove_all(dir);
  }
};
}  // namespace

TEST_CASE("nvidia-smi's GPUs are counted, and a hung nvidia-smi is given up on rather than waited for") {
  {
    FakeNvidiaSmi smi("echo 0; echo 1; echo 2");
    auto inv = discover_gpus({});
    if (inv.source != "the CUDA driver") {  // a machine with a driver asks it first
      CHECK(inv.source == "nvidia-smi");
      CHECK(inv.count() == 3);
    }
  }
  FakeNvidiaSmi hung("exec sleep 3600");
  auto inv = discover_gpus({});  // returns (after nvidia-smi's 10 s) instead of hanging ddl run
  CHECK(inv.source != "nvidia-smi");
}
