// The launch lines and output formats of srun, Cray PALS mpiexec and OpenMPI mpirun.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>

#include "backends/launch_layout.hpp"
#include "backends/pbs/pbs_launch.hpp"
#include "backends/slurm/slurm_launch.hpp"
#include "common/error.hpp"

using namespace ddl::backends;

namespace {
TaskLayout two_by_four() {
  TaskLayout layout;
  layout.num_nodes = 2;
  layout.tasks_per_node = 4;
  layout.cpus_per_task = 16;
  layout.task_command = {"/opt/ddl/bin/ddl", "exec", "--", "python3", "train.py"};
  layout.exported_names = {"DDL_STORE_TOKEN", "MASTER_ADDR"};
  return layout;
}
}  // namespace

TEST_CASE("srun gets counts per node, cpus per task, kill-on-bad-exit, labels and block ranks") {
  auto argv = slurm::srun_command(two_by_four(), "pmix");
  const std::vector<std::string> expected{"srun",
                                          "--nodes=2",
                                          "--ntasks=8",
                                          "--ntasks-per-node=4",
                                          "--cpus-per-task=16",
                                          "--kill-on-bad-exit=1",
                                          "--export=ALL",
                                          "--label",
                                          "--distribution=block",
                                          "--mpi=pmix",
                                          "/opt/ddl/bin/ddl",
                                          "exec",
                                          "--",
                                          "python3",
                                          "train.py"};
  CHECK(argv == expected);
  CHECK(slurm::srun_command(two_by_four(), "").size() == expected.size() - 1);
}

TEST_CASE("PALS mpiexec: -n, --ppn, --depth with depth binding (Polaris)") {
  auto argv = pbs::pals_command(two_by_four());
  const std::vector<std::string> expected{"mpiexec",          "-n",   "8",          "--ppn",   "4",
                                          "--depth",          "16",   "--cpu-bind", "depth",   "--label",
                                          "/opt/ddl/bin/ddl", "exec", "--",         "python3", "train.py"};
  CHECK(argv == expected);
}

TEST_CASE("OpenMPI mpirun: the PBS node file, ppr per node, variables exported by name only") {
  auto argv = pbs::openmpi_command(two_by_four(), "/var/spool/pbs/aux/1.pbs", false);
  const std::vector<std::string> expected{"mpirun",
                                          "-np",
                                          "8",
                                          "--hostfile",
                                          "/var/spool/pbs/aux/1.pbs",
                                          "--map-by",
                                          "ppr:4:node",
                                          "--bind-to",
                                          "none",
                                          "--oversubscribe",
                                          "--tag-output",
                                          "-x",
                                          "DDL_STORE_TOKEN",
                                          "-x",
                                          "MASTER_ADDR",
                                          "/opt/ddl/bin/ddl",
                                          "exec",
                                          "--",
                                          "python3",
                                          "train.py"};
  CHECK(argv == expected);
  CHECK(pbs::openmpi_command(two_by_four(), "f", true)[1] == "--allow-run-as-root");
}

TEST_CASE("srun and PALS labels: 'N: text'") {
  auto a = rank_colon_label("  12: loss 0.5");
  REQUIRE(a);
  CHECK(a->rank == 12);
  CHECK(a->text == "loss 0.5");
  CHECK(rank_colon_label("3: ")->text == "");
  CHECK_FALSE(rank_colon_label("srun: error: x"));
  CHECK_FALSE(rank_colon_label("12 apples: 3"));
}

TEST_CASE("mpirun --tag-output: pieces of several tasks' lines are put back together per task") {
  pbs::OpenMpiOutput out;
  auto b = out.feed("[1,7]<stderr>:Traceback: x");
  REQUIRE(b);
  REQUIRE(b->size() == 1);
  CHECK((*b)[0].rank == 7);
  CHECK((*b)[0].text == "Traceback: x");
  // An unbuffered writer's text and newline arrive apart, and another task's piece in between.
  auto first = out.feed("[1,0]<stdout>:WORKER a[1,1]<stdout>:WORKER b");
  REQUIRE(first);
  REQUIRE(first->size() == 1);
  CHECK((*first)[0].rank == 1);
  CHECK((*first)[0].text == "WORKER b");
  auto second = out.feed("[1,0]<stdout>:");
  REQUIRE(second);
  REQUIRE(second->size() == 1);
  CHECK((*second)[0].rank == 0);
  CHECK((*second)[0].text == "WORKER a");
  CHECK_FALSE(out.feed("[warn] something"));
  CHECK_FALSE(out.feed("Primary job terminated normally"));
}

TEST_CASE("mpirun --tag-output: a tag printed by a task is its text where the tasks' lines have a known form") {
  // As ddl exec --relay's lines: "rank: text". A real tag inside a line starts such a line, or
  // continues its task's piece that waits for its end.
  auto relayed = [](int rank, std::string_view text) { return text.starts_with(std::to_string(rank) + ": "); };
  pbs::OpenMpiOutput out(relayed);
  auto spoof = out.feed("[1,0]<stdout>:0: says [1,1]<stdout>:FAKE from 1");
  REQUIRE(spoof);
  REQUIRE(spoof->size() == 1);
  CHECK((*spoof)[0].rank == 0);
  CHECK((*spoof)[0].text == "0: says [1,1]<stdout>:FAKE from 1");
  auto mixed = out.feed("[1,0]<stdout>:0: a[1,1]<stdout>:1: b");  // a real piece of rank 1 in rank 0's line
  REQUIRE(mixed);
  REQUIRE(mixed->size() == 1);
  CHECK((*mixed)[0].rank == 1);
  CHECK((*mixed)[0].text == "1: b");
  auto rest = out.feed("[1,2]<stdout>:2: c[1,0]<stdout>: and the rest");  // rank 0's piece waits: its tag is real
  REQUIRE(rest);
  REQUIRE(rest->size() == 1);
  CHECK((*rest)[0].rank == 0);
  CHECK((*rest)[0].text == "0: a and the rest");
  auto third = out.feed("[1,2]<stdout>:");
  REQUIRE(third);
  CHECK((*third)[0].text == "2: c");
}

TEST_CASE("mpirun --tag-output: a task's own text of 100,000 digits after '[' is its text, not a crash") {
  pbs::OpenMpiOutput out;
  const std::string digits = "[" + std::string(100000, '7') + ",1]<stdout>:x";
  auto lines = out.feed("[1,3]<stdout>:" + digits);
  REQUIRE(lines);
  REQUIRE(lines->size() == 1);
  CHECK((*lines)[0].rank == 3);
  CHECK((*lines)[0].text == digits);
  CHECK_FALSE(out.feed(digits));  // untagged: not a task's line
}

TEST_CASE("srun's report of the failed task: rank, host, exit code or signal") {
  std::deque<std::string> said{"srun: launch/slurm: _step_signal: Terminating StepId=2.0",
                               "srun: error: nid004: task 5: Exited with exit code 7", "srun: error: nid001: tasks 0-4,6-7: Terminated"};
  auto task = slurm::failed_task(said);
  REQUIRE(task);
  CHECK(task->rank == 5);
  CHECK(task->host == "nid004");
  CHECK(task->exit_code == 7);
  CHECK(task->signal == 0);
  auto killed = slurm::failed_task({"srun: error: nid002: task 3: Segmentation fault (core dumped)"});
  REQUIRE(killed);
  CHECK(killed->signal == 11);
  CHECK(killed->exit_code == 139);
  CHECK_FALSE(slurm::failed_task({"srun: error: Unable to allocate resources: Invalid account"}));
}

TEST_CASE("the step an srun started is found by its pid, on this host first") {
  const std::string steps =
      "StepId=12.0 UserId=0 State=RUNNING NodeList=nid[001-002] Name=python SrunHost:Pid=nid001:4242 Tasks=8\n"
      "StepId=12.1 UserId=0 State=RUNNING NodeList=nid003 Name=ddl SrunHost:Pid=nid003:424 Tasks=4\n"
      "StepId=12.2 UserId=0 State=RUNNING NodeList=nid004 Name=ddl SrunHost:Pid=nid004:424 Tasks=4\n"
      "StepId=12.batch UserId=0 State=RUNNING NodeList=nid001 Name=batch\n";
  CHECK(slurm::step_of_srun(steps, 4242, "nid001") == "12.0");
  CHECK(slurm::step_of_srun(steps, 424, "nid004") == "12.2");   // not 12.1: another host's srun of the same pid
  CHECK_FALSE(slurm::step_of_srun(steps, 424, "login1"));       // two other hosts' srun of that pid: neither is sure
  CHECK(slurm::step_of_srun(steps, 4242, "login1") == "12.0");  // the only step of that pid, this host named otherwise
  CHECK_FALSE(slurm::step_of_srun(steps, 42, "nid001"));        // a pid that ends like one is not it
  CHECK_FALSE(slurm::step_of_srun("", 4242, "nid001"));
}

// A task's words pass through srun's stderr: std::regex recurses once per character (a segfault at
// 40,000), and std::stoi throws on a number past int's range ("this is a bug").
TEST_CASE("srun's report: a line of 40,000 characters or a number past int's range is not read as one") {
  CHECK_FALSE(slurm::failed_task({"srun: error: nid001: task 0: " + std::string(40000, 'x')}));
  CHECK_FALSE(slurm::failed_task({"srun: error: nid001: task 99999999999: Exited with exit code 3"}));
  CHECK_FALSE(slurm::failed_task({"srun: error: nid001: task 1: Exited with exit code 99999999999"}));
  auto task = slurm::failed_task(
      {"srun: error: nid001: task 99999999999: Exited with exit code 3", "srun: error: nid002: task 999999999: Exited with exit code 4"});
  REQUIRE(task);
  CHECK(task->rank == 999999999);
  CHECK(task->exit_code == 4);
}

TEST_CASE("Slurm allocation facts: GPUs and CPUs per node in every form Slurm writes them") {
  CHECK(slurm::gpus_per_node({{"SLURM_GPUS_ON_NODE", "4"}}) == 4);
  CHECK(slurm::gpus_per_node({{"SLURM_GPUS_PER_NODE", "a100:4"}}) == 4);
  CHECK(slurm::gpus_per_node({{"SLURM_JOB_GPUS", "0,1,2"}}) == 3);
  CHECK(slurm::gpus_per_node({{"SLURM_JOB_GPUS", "0-3,6"}}) == 5);
  CHECK(slurm::gpus_per_node({{"SLURM_JOB_GPUS", ",,,,"}}) == 0);  // was 5 (its commas counted)
  CHECK(slurm::gpus_per_node({{"SLURM_JOB_GPUS", ""}}) == 0);
  CHECK_THROWS_WITH_AS(slurm::gpus_per_node({{"SLURM_JOB_GPUS", "gpu0"}}), doctest::Contains("SLURM_JOB_GPUS='gpu0' is not a list"),
                       ddl::Error);
  CHECK(slurm::gpus_per_node({}) == 0);
  CHECK(slurm::cpus_per_node({{"SLURM_JOB_CPUS_PER_NODE", "128(x2)"}}) == 128);
}

// The sum of the counts can overflow an int (a case of tests/fuzz's fuzz_slurm_tasks). And read with
// atoi, 99999999999 would wrap to 1215752191 srun tasks, "abc" would become 0 GPUs.
TEST_CASE("counts Slurm would not write are an error naming the variable, not a wrapped or zero count") {
  CHECK_THROWS_WITH_AS(slurm::gpus_per_node({{"SLURM_GPUS_PER_NODE", "a100:2000000000,v100:2000000000"}}),
                       doctest::Contains("SLURM_GPUS_PER_NODE="), ddl::Error);
  CHECK_THROWS_WITH_AS(slurm::gpus_per_node({{"SLURM_GPUS_ON_NODE", "99999999999"}}), doctest::Contains("SLURM_GPUS_ON_NODE='99999999999'"),
                       ddl::Error);
  CHECK_THROWS_AS(slurm::gpus_per_node({{"SLURM_GPUS_ON_NODE", "abc"}}), ddl::Error);
  CHECK_THROWS_AS(slurm::gpus_per_node({{"SLURM_GPUS_PER_NODE", "a100:4x"}}), ddl::Error);
  CHECK_THROWS_AS(slurm::cpus_per_node({{"SLURM_JOB_CPUS_PER_NODE", "4x"}}), ddl::Error);
  CHECK_THROWS_AS(slurm::tasks_per_node({{"SLURM_NTASKS_PER_NODE", "-3"}}, 1), ddl::Error);
  CHECK(slurm::gpus_per_node({{"SLURM_GPUS_PER_NODE", "a100:2,v100:1"}}) == 3);
  CHECK(slurm::cpus_per_node({{"SLURM_JOB_CPUS_PER_NODE", "64(x2),32"}}) == 64);
}

TEST_CASE("the tasks srun would start on each node of the allocation") {
  CHECK(slurm::tasks_per_node({{"SLURM_TASKS_PER_NODE", "2(x2)"}}, 2) == std::vector<int>{2, 2});
  CHECK(slurm::tasks_per_node({{"SLURM_TASKS_PER_NODE", "2(x3),1"}}, 4) == std::vector<int>{2, 2, 2, 1});
  CHECK(slurm::tasks_per_node({{"SLURM_TASKS_PER_NODE", "4"}}, 1) == std::vector<int>{4});
  CHECK(slurm::tasks_per_node({{"SLURM_NTASKS_PER_NODE", "3"}}, 2) == std::vector<int>{3, 3});
  CHECK(slurm::tasks_per_node({{"SLURM_TASKS_PER_NODE", "2(x"}}, 2).empty());
  CHECK(slurm::tasks_per_node({{"SLURM_TASKS_PER_NODE", "0"}}, 1).empty());
  CHECK(slurm::tasks_per_node({{"SLURM_TASKS_PER_NODE", "1(x99999999)"}}, 1).empty());
  CHECK(slurm::tasks_per_node({}, 2).empty());
  CHECK(slurm::expand_hostlist("nid001") == std::vector<std::string>{"nid001"});
}

TEST_CASE("the PBS node file: distinct hosts in order; a missing file names it") {
  const std::string path = "/tmp/ddl_unit_nodefile";
  {
    std::ofstream f(path);
    f << "x3102c0s13b0n0\nx3102c0s13b0n0\nx3102c0s13b1n0\n\n";
  }
  CHECK(pbs::nodefile_hosts(path) == std::vector<std::string>{"x3102c0s13b0n0", "x3102c0s13b1n0"});
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(pbs::nodefile_hosts(path), doctest::Contains("/tmp/ddl_unit_nodefile"), ddl::Error);
}

// Searching for each line among the hosts before it, 300,000 lines would take minutes, with signals
// blocked (ddl run could not be stopped).
TEST_CASE("the PBS node file: 300,000 distinct hosts are read in one pass") {
  const std::string path = "/tmp/ddl_unit_nodefile_large";
  {
    std::ofstream f(path);
    for (int i = 0; i < 300000; ++i)
      f << "n" << i << "\n"
        << "n" << i << "\n";
  }
  const auto hosts = pbs::nodefile_hosts(path);
  std::remove(path.c_str());
  REQUIRE(hosts.size() == 300000);
  CHECK(hosts.front() == "n0");
  CHECK(hosts.back() == "n299999");
}

TEST_CASE("nodes named after --exclude: srun --nodelist, PALS --hosts, mpirun --host with slots") {
  TaskLayout layout = two_by_four();
  layout.hosts = {"nid002", "nid004"};
  const auto srun = slurm::srun_command(layout, "");
  CHECK(std::count(srun.begin(), srun.end(), "--nodelist=nid002,nid004") == 1);
  CHECK(std::find(srun.begin(), srun.end(), "--nodelist=nid002,nid004") < std::find(srun.begin(), srun.end(), "/opt/ddl/bin/ddl"));
  const auto pals = pbs::pals_command(layout);
  const auto hosts = std::find(pals.begin(), pals.end(), "--hosts");
  REQUIRE(hosts != pals.end());
  CHECK(*(hosts + 1) == "nid002,nid004");
  CHECK(hosts < std::find(pals.begin(), pals.end(), "/opt/ddl/bin/ddl"));
  const auto mpirun = pbs::openmpi_command(layout, "/var/spool/pbs/aux/1.pbs", false);
  const std::vector<std::string> placement(mpirun.begin(), mpirun.begin() + 5);
  CHECK(placement == std::vector<std::string>{"mpirun", "-np", "8", "--host", "nid002:4,nid004:4"});
  CHECK(std::find(mpirun.begin(), mpirun.end(), "--hostfile") == mpirun.end());
}
