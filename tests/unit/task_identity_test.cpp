// ddl exec: every launcher's variables mapped onto the contract.
#include <doctest/doctest.h>

#include "common/error.hpp"
#include "launcher/exec_task.hpp"
#include "launcher/task_identity.hpp"

using namespace ddl::launcher;

namespace {
void check(const TaskIdentity& id, int rank, int size, int local_rank, int local_size, int node_rank, int num_nodes) {
  CHECK(id.rank == rank);
  CHECK(id.size == size);
  CHECK(id.local_rank == local_rank);
  CHECK(id.local_size == local_size);
  CHECK(id.node_rank == node_rank);
  CHECK(id.num_nodes == num_nodes);
}
}  // namespace

TEST_CASE("Slurm tasks: ranks from SLURM_*, local size from the step's tasks per node") {
  ddl::Environment env{{"SLURM_PROCID", "9"},  {"SLURM_LOCALID", "1"},        {"SLURM_NODEID", "2"},
                       {"SLURM_NTASKS", "11"}, {"SLURM_STEP_NUM_NODES", "3"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"}};
  check(task_identity(env), 9, 11, 1, 3, 2, 3);
  CHECK(task_identity(env).source == "Slurm (SLURM_PROCID)");
}

TEST_CASE("OpenMPI tasks: node rank from the block layout, not OMPI_COMM_WORLD_NODE_RANK") {
  ddl::Environment env{{"OMPI_COMM_WORLD_RANK", "5"},       {"OMPI_COMM_WORLD_SIZE", "8"},      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"OMPI_COMM_WORLD_NODE_RANK", "1"}, {"PMIX_RANK", "5"}};
  check(task_identity(env), 5, 8, 1, 4, 1, 2);
}

TEST_CASE("mpirun inside a Slurm job: OpenMPI's ranks win over the batch script's inherited SLURM_PROCID=0") {
  ddl::Environment env{{"SLURM_PROCID", "0"},
                       {"SLURM_LOCALID", "0"},
                       {"SLURM_NTASKS", "1"},
                       {"SLURM_NODEID", "0"},
                       {"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  check(task_identity(env), 3, 4, 1, 2, 1, 2);
}

TEST_CASE("Cray PALS tasks (Polaris)") {
  ddl::Environment env{{"PALS_RANKID", "6"}, {"PALS_LOCAL_RANKID", "2"}, {"PALS_NODEID", "1"},   {"PMI_RANK", "6"},
                       {"PMI_SIZE", "8"},    {"PMI_LOCAL_SIZE", "4"},    {"PMI_LOCAL_RANK", "2"}};
  check(task_identity(env), 6, 8, 2, 4, 1, 2);
}

TEST_CASE("MPICH-style PMI tasks") {
  ddl::Environment env{{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}};
  check(task_identity(env), 3, 4, 1, 2, 1, 2);
}

// Slurm's pmi2 plugin gives PMI_RANK and PMI_SIZE alone: every task read as node 0 with local rank = rank.
TEST_CASE("srun --mpi=pmi2 tasks: Slurm's local and node ranks, which PMI does not give") {
  ddl::Environment env{{"PMI_RANK", "5"},     {"PMI_SIZE", "8"},     {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"},
                       {"SLURM_NODEID", "1"}, {"SLURM_NTASKS", "8"}, {"SLURM_NNODES", "2"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}};
  check(task_identity(env), 5, 8, 1, 4, 1, 2);
  // An mpiexec inside a batch script: the script's own SLURM_PROCID=0 describes no task of it.
  env["SLURM_PROCID"] = "0";
  env["SLURM_LOCALID"] = "0";
  env["SLURM_NODEID"] = "0";
  env["MPI_LOCALRANKID"] = "1";
  env["MPI_LOCALNRANKS"] = "4";
  check(task_identity(env), 5, 8, 1, 4, 1, 2);
  CHECK(task_identity(env).source == "PMI (PMI_RANK)");
}

TEST_CASE("a bare PMIx rank takes the world's shape from what ddl run exported") {
  ddl::Environment env{{"PMIX_RANK", "7"}, {"DDL_SIZE", "8"}, {"DDL_LOCAL_SIZE", "4"}, {"DDL_NUM_NODES", "2"}};
  check(task_identity(env), 7, 8, 3, 4, 1, 2);
}

TEST_CASE("no launcher, a non-number, or a world that disagrees with ddl run's plan is a usage error naming it") {
  CHECK_THROWS_WITH_AS(task_identity({}), doctest::Contains("none of OMPI_COMM_WORLD_RANK"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(task_identity({{"SLURM_PROCID", "x1"}}), doctest::Contains("SLURM_PROCID=x1"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(task_identity({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"DDL_SIZE", "8"}}),
                       doctest::Contains("started 4 tasks but ddl run planned 8"), ddl::UsageError);
}

TEST_CASE("Slurm's compressed tasks-per-node form") {
  CHECK(tasks_on_node("4", 0) == 4);
  CHECK(tasks_on_node("4(x2),3", 1) == 4);
  CHECK(tasks_on_node("4(x2),3", 2) == 3);
  CHECK_THROWS_AS(tasks_on_node("4(x2),3", 3), ddl::UsageError);
}

TEST_CASE("ddl exec pins the local-rank-th GPU Slurm gave the node, or the reversed order on Polaris") {
  ddl::Environment env{{"SLURM_PROCID", "5"},
                       {"SLURM_LOCALID", "1"},
                       {"SLURM_NODEID", "1"},
                       {"SLURM_NTASKS", "8"},
                       {"SLURM_NNODES", "2"},
                       {"SLURM_TASKS_PER_NODE", "4(x2)"},
                       {"CUDA_VISIBLE_DEVICES", "4,5,6,7"},
                       {"SLURM_CPUS_PER_TASK", "16"},
                       {"DDL_GPU_WORKERS", "1"},
                       {"MASTER_ADDR", "nid001"},
                       {"MASTER_PORT", "29500"},
                       {"DDL_STORE_ADDR", "nid001:4000"},
                       {"DDL_STORE_TOKEN", "t"},
                       {"DDL_RUN_ID", "42-ab"}};
  const auto id = task_identity(env);
  const auto gpus = parse_visible_devices("4,5,6,7");
  ddl::Environment out = task_environment(env, id, {}, gpus);
  CHECK(out["CUDA_VISIBLE_DEVICES"] == "5");
  CHECK(out["RANK"] == "5");
  CHECK(out["LOCAL_RANK"] == "1");
  CHECK(out["GROUP_RANK"] == "1");
  CHECK(out["WORLD_SIZE"] == "8");
  CHECK(out["OMP_NUM_THREADS"] == "16");
  CHECK(out["MASTER_ADDR"] == "nid001");
  CHECK(out["MASTER_PORT"] == "29500");
  CHECK(out["TORCHELASTIC_RUN_ID"] == "42-ab");
  CHECK(out.count("DDL_GPU_WORKERS") == 0);

  ExecRequest reversed;
  reversed.gpu_order = GpuOrder::Reversed;
  CHECK(task_environment(env, id, reversed, gpus)["CUDA_VISIBLE_DEVICES"] == "6");
}

TEST_CASE("a planned GPU worker on a node without GPUs is an error; a CPU worker's GPU variable is untouched") {
  ddl::Environment env{{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}, {"DDL_GPU_WORKERS", "1"}};
  CHECK_THROWS_WITH_AS(task_environment(env, task_identity(env), {}, {}), doctest::Contains("should get a GPU"), ddl::UsageError);
  env["DDL_GPU_WORKERS"] = "0";
  env["CUDA_VISIBLE_DEVICES"] = "3";
  CHECK(task_environment(env, task_identity(env), {}, parse_visible_devices("3"))["CUDA_VISIBLE_DEVICES"] == "3");
}

TEST_CASE("more tasks on a node than the GPUs they see is an error, unless ddl run was told --share-gpus") {
  ddl::Environment env{{"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "3"},        {"SLURM_NODEID", "0"},   {"SLURM_NTASKS", "4"},
                       {"SLURM_NNODES", "1"}, {"SLURM_TASKS_PER_NODE", "4"}, {"DDL_GPU_WORKERS", "1"}};
  const auto id = task_identity(env);
  CHECK_THROWS_WITH_AS(task_environment(env, id, {}, parse_visible_devices("0,1")), doctest::Contains("local rank 3 on "), ddl::UsageError);
  env["DDL_SHARE_GPUS"] = "1";
  const ddl::Environment shared = task_environment(env, id, {}, parse_visible_devices("0,1"));
  CHECK(shared.at("CUDA_VISIBLE_DEVICES") == "1");
  CHECK(shared.count("DDL_SHARE_GPUS") == 0);
  env.erase("DDL_SHARE_GPUS");  // one GPU per task (srun --gpus-per-task=1): each sees its own as 0
  CHECK(task_environment(env, id, {}, parse_visible_devices("2")).at("CUDA_VISIBLE_DEVICES") == "2");
  env.erase("DDL_GPU_WORKERS");  // srun ddl exec without ddl run: a task may hold GPUs of its own (--gpus-per-task=2)
  CHECK(task_environment(env, id, {}, parse_visible_devices("0,1")).at("CUDA_VISIBLE_DEVICES") == "1");
}

TEST_CASE("tasks over nodes of different sizes: the launcher's world size, each node's own local size") {
  // srun -n 11 over 4 + 4 + 3: rank 9 on the third node sees the world of 11 and Horovod's cross ranks.
  ddl::Environment slurm{{"SLURM_PROCID", "9"},  {"SLURM_LOCALID", "1"},        {"SLURM_NODEID", "2"},
                         {"SLURM_NTASKS", "11"}, {"SLURM_STEP_NUM_NODES", "3"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"}};
  ddl::Environment out = task_environment(slurm, task_identity(slurm), {}, {});
  CHECK((out["WORLD_SIZE"] == "11" && out["DDL_SIZE"] == "11" && out["HOROVOD_SIZE"] == "11" && out["ROLE_WORLD_SIZE"] == "11"));
  CHECK((out["LOCAL_WORLD_SIZE"] == "3" && out["DDL_LOCAL_SIZE"] == "3" && out["GROUP_RANK"] == "2"));
  CHECK((out["HOROVOD_CROSS_RANK"] == "2" && out["HOROVOD_CROSS_SIZE"] == "3"));
  slurm["SLURM_PROCID"] = "7";  // local rank 3 of the second node: only two nodes have a local rank 3
  slurm["SLURM_LOCALID"] = "3";
  slurm["SLURM_NODEID"] = "1";
  out = task_environment(slurm, task_identity(slurm), {}, {});
  CHECK((out["LOCAL_WORLD_SIZE"] == "4" && out["HOROVOD_CROSS_RANK"] == "1" && out["HOROVOD_CROSS_SIZE"] == "2"));

  // srun -n 6 over 3 + 2 + 1: the second node's 2 x 3 nodes is 6, yet the nodes differ.
  ddl::Environment three{{"SLURM_PROCID", "4"}, {"SLURM_LOCALID", "1"},        {"SLURM_NODEID", "1"},
                         {"SLURM_NTASKS", "6"}, {"SLURM_STEP_NUM_NODES", "3"}, {"SLURM_STEP_TASKS_PER_NODE", "3,2,1"}};
  out = task_environment(three, task_identity(three), {}, {});
  CHECK(
      (out["WORLD_SIZE"] == "6" && out["LOCAL_WORLD_SIZE"] == "2" && out["HOROVOD_CROSS_RANK"] == "1" && out["HOROVOD_CROSS_SIZE"] == "2"));
  CHECK(tasks_on_nodes("4(x2),3", 3) == std::vector<int>{4, 4, 3});
  CHECK(tasks_on_nodes("2(x1000000000)", 2) == std::vector<int>{2, 2});
  CHECK_THROWS_AS(tasks_on_nodes("4(x2)", 3), ddl::UsageError);
  CHECK_THROWS_AS(tasks_on_nodes("x", 1), ddl::UsageError);
  CHECK_THROWS_AS(tasks_on_nodes("4abc,9", 2), ddl::UsageError);  // was 4 and 9
  for (const char* junk : {"2(y2)", "2(x2", "2(x2)z", " 2", "+2", "99999999999(x2)", "2(x99999999999)", "0(x2)", "2(x0)", "(x2)"})
    CHECK_THROWS_AS(tasks_on_nodes(junk, 1), ddl::UsageError);
  CHECK(tasks_on_nodes("2(x1),3", 2) == std::vector<int>{2, 3});

  // mpirun -np 5 over 4 + 1 slots: the other node's size is not said, the world's size still is.
  ddl::Environment openmpi{{"OMPI_COMM_WORLD_RANK", "4"},
                           {"OMPI_COMM_WORLD_SIZE", "5"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                           {"DDL_NUM_NODES", "2"}};
  const TaskIdentity id = task_identity(openmpi);
  out = task_environment(openmpi, id, {}, {});
  CHECK((out["WORLD_SIZE"] == "5" && out["DDL_SIZE"] == "5" && out["LOCAL_WORLD_SIZE"] == "1" && out["RANK"] == "4"));
  CHECK((id.node_rank == 1 && out["GROUP_RANK"] == "1" && out["DDL_NODE_RANK"] == "1"));  // the second of 2 nodes, not the fifth
  openmpi["DDL_LOCAL_SIZE"] = "4";                                                        // as ddl run exports it: nodes of 4
  CHECK(task_identity(openmpi).node_rank == 1);
}

TEST_CASE("a local or node rank the launcher gives beyond its own counts is an error naming the launcher") {
  ddl::Environment local{
      {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "7"}, {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}};
  CHECK_THROWS_WITH_AS(task_identity(local), doctest::Contains("local rank 7 is not below the node's task count 2"), ddl::UsageError);
  ddl::Environment node{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODEID", "9"}, {"SLURM_STEP_NUM_NODES", "1"}};
  CHECK_THROWS_WITH_AS(task_identity(node), doctest::Contains("node rank 9 is not below the node count 1"), ddl::UsageError);
}

TEST_CASE("a count of 0 is an error naming its variable; the largest world counts its nodes without overflow") {
  for (const char* name : {"DDL_LOCAL_SIZE", "DDL_SIZE", "DDL_NUM_NODES", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"}) {
    ddl::Environment env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}};
    env[name] = "0";
    const std::string needle = std::string(name) + "=0 is not a count of 1 or more";
    CHECK_THROWS_WITH_AS(task_identity(env), doctest::Contains(needle.c_str()), ddl::UsageError);
  }
  // A node rank worked out from DDL_LOCAL_SIZE=0 divided by zero (SIGFPE).
  CHECK_THROWS_AS(task_identity({{"PMIX_RANK", "0"}, {"DDL_LOCAL_SIZE", "0"}}), ddl::UsageError);
  const ddl::Environment largest{
      {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2147483647"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  check(task_identity(largest), 0, 2147483647, 0, 2, 0, 1073741824);  // was node -1073741825 of -1073741824
}
