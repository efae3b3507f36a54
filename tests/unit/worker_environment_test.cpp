#include <doctest/doctest.h>

#include "common/environment.hpp"
#include "launcher/worker_environment.hpp"

using namespace ddl::launcher;

namespace {
RunContext sample_run() {
  RunContext run;
  run.run_id = "ddl-abc";
  run.store_addr = "127.0.0.1:5000";
  run.store_token = "secret";
  run.master_addr = "127.0.0.1";
  run.master_port = 29511;
  run.cpus_on_node = 16;
  return run;
}
}  // namespace

// atoi reads "99999999999" as 1215752191 (NCPUS: that many OpenMP threads per worker) or -1.
TEST_CASE("counts from the environment are whole numbers within range, or nothing") {
  CHECK(ddl::whole_number("0", 10) == 0);
  CHECK(ddl::whole_number("16", 1 << 20) == 16);
  CHECK(ddl::whole_number("1048576", 1 << 20) == 1048576);
  CHECK_FALSE(ddl::whole_number("1048577", 1 << 20));
  CHECK_FALSE(ddl::whole_number("99999999999999999999999", 1 << 20));
  CHECK_FALSE(ddl::whole_number("", 10));
  CHECK_FALSE(ddl::whole_number("4x", 10));
  CHECK_FALSE(ddl::whole_number("-1", 10));
  CHECK_FALSE(ddl::whole_number(" 4", 10));
}

TEST_CASE("every contract variable has the value of the worker's rank") {
  WorldPlan plan{2, 4, true};
  WorkerSlot w = plan.slot(6);
  auto gpus = parse_visible_devices("2,3,5,7");
  ddl::Environment env = worker_environment({{"HOME", "/root"}}, plan, w, sample_run(), gpus);
  const ddl::Environment expected{{"HOME", "/root"},
                                  {"DDL_RANK", "6"},
                                  {"DDL_SIZE", "8"},
                                  {"DDL_LOCAL_RANK", "2"},
                                  {"DDL_LOCAL_SIZE", "4"},
                                  {"DDL_NODE_RANK", "1"},
                                  {"DDL_NUM_NODES", "2"},
                                  {"DDL_STORE_ADDR", "127.0.0.1:5000"},
                                  {"DDL_STORE_TOKEN", "secret"},
                                  {"DDL_RUN_ID", "ddl-abc"},
                                  {"RANK", "6"},
                                  {"WORLD_SIZE", "8"},
                                  {"LOCAL_RANK", "2"},
                                  {"LOCAL_WORLD_SIZE", "4"},
                                  {"GROUP_RANK", "1"},
                                  {"GROUP_WORLD_SIZE", "2"},
                                  {"ROLE_RANK", "6"},
                                  {"ROLE_WORLD_SIZE", "8"},
                                  {"ROLE_NAME", "default"},
                                  {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", "29511"},
                                  {"TORCHELASTIC_RUN_ID", "ddl-abc"},
                                  {"TORCHELASTIC_RESTART_COUNT", "0"},
                                  {"TORCHELASTIC_MAX_RESTARTS", "0"},
                                  {"HOROVOD_RANK", "6"},
                                  {"HOROVOD_SIZE", "8"},
                                  {"HOROVOD_LOCAL_RANK", "2"},
                                  {"HOROVOD_LOCAL_SIZE", "4"},
                                  {"HOROVOD_CROSS_RANK", "1"},
                                  {"HOROVOD_CROSS_SIZE", "2"},
                                  {"CUDA_VISIBLE_DEVICES", "5"},
                                  {"OMP_NUM_THREADS", "4"},
                                  {"PYTHONUNBUFFERED", "1"}};
  CHECK(env == expected);
}

TEST_CASE("CPU workers leave the GPU variable as it was") {
  WorldPlan plan{1, 2, false};
  ddl::Environment env = worker_environment({{"CUDA_VISIBLE_DEVICES", "3"}}, plan, plan.slot(1), sample_run(), {});
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "3");
  ddl::Environment bare = worker_environment({}, plan, plan.slot(1), sample_run(), {});
  CHECK(bare.count("CUDA_VISIBLE_DEVICES") == 0);
}

TEST_CASE("OMP_NUM_THREADS is cores per worker, at least 1, unless the user set it (empty is not set)") {
  CHECK(threads_per_worker(16, 4) == 4);
  CHECK(threads_per_worker(2, 4) == 1);
  CHECK(threads_per_worker(7, 2) == 3);
  WorldPlan plan{1, 4, false};
  CHECK(worker_environment({{"OMP_NUM_THREADS", "9"}}, plan, plan.slot(0), sample_run(), {}).at("OMP_NUM_THREADS") == "9");
  const std::string derived = worker_environment({}, plan, plan.slot(0), sample_run(), {}).at("OMP_NUM_THREADS");
  CHECK(worker_environment({{"OMP_NUM_THREADS", ""}}, plan, plan.slot(0), sample_run(), {}).at("OMP_NUM_THREADS") == derived);
}

TEST_CASE("PYTHONUNBUFFERED is 1 unless the user set it (empty is not set, to Python either)") {
  WorldPlan plan{1, 2, false};
  CHECK(worker_environment({}, plan, plan.slot(0), sample_run(), {}).at("PYTHONUNBUFFERED") == "1");
  CHECK(worker_environment({{"PYTHONUNBUFFERED", ""}}, plan, plan.slot(0), sample_run(), {}).at("PYTHONUNBUFFERED") == "1");
  CHECK(worker_environment({{"PYTHONUNBUFFERED", "0"}}, plan, plan.slot(0), sample_run(), {}).at("PYTHONUNBUFFERED") == "0");
}

TEST_CASE("the launcher's own values of contract variables are replaced") {
  WorldPlan plan{1, 2, false};
  auto env = worker_environment({{"RANK", "99"}, {"MASTER_PORT", "1"}}, plan, plan.slot(1), sample_run(), {});
  CHECK(env.at("RANK") == "1");
  CHECK(env.at("MASTER_PORT") == "29511");
}

TEST_CASE("on hosts of different sizes each worker has its own host's local size and Horovod's cross ranks") {
  const WorldPlan plan = plan_with_node_sizes({2, 4}, true);
  const auto gpus = parse_visible_devices("0,1,2,3");
  ddl::Environment env = worker_environment({}, plan, plan.slot(5), sample_run(), gpus);  // node 1, local rank 3
  CHECK((env.at("DDL_SIZE") == "6" && env.at("DDL_LOCAL_RANK") == "3" && env.at("DDL_NODE_RANK") == "1"));
  CHECK((env.at("DDL_LOCAL_SIZE") == "4" && env.at("LOCAL_WORLD_SIZE") == "4" && env.at("HOROVOD_LOCAL_SIZE") == "4"));
  CHECK((env.at("HOROVOD_CROSS_RANK") == "0" && env.at("HOROVOD_CROSS_SIZE") == "1"));  // only node 1 has local rank 3
  CHECK((env.at("CUDA_VISIBLE_DEVICES") == "3" && env.at("OMP_NUM_THREADS") == "4"));
  ddl::Environment first = worker_environment({}, plan, plan.slot(1), sample_run(), gpus);
  CHECK((first.at("DDL_LOCAL_SIZE") == "2" && first.at("HOROVOD_CROSS_RANK") == "0" && first.at("HOROVOD_CROSS_SIZE") == "2"));
  CHECK(first.at("OMP_NUM_THREADS") == "8");
  CHECK(worker_environment({}, plan, plan.slot(3), sample_run(), gpus).at("HOROVOD_CROSS_RANK") == "1");
}
