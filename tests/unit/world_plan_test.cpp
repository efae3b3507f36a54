#include <array>

#include <doctest/doctest.h>

#include "common/error.hpp"
#include "launcher/world_plan.hpp"

using namespace ddl::launcher;

TEST_CASE("-np alone on one node gives that many workers, ranks in node-major order") {
  LaunchRequest r;
  r.total_workers = 4;
  WorldPlan p = plan_world(r, 0);
  CHECK(p.num_nodes == 1);
  CHECK(p.workers_per_node == 4);
  CHECK(p.world_size() == 4);
  CHECK_FALSE(p.gpu_workers);
  auto slots = p.slots_on_node(0);
  REQUIRE(slots.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(slots[i].rank == i);
    CHECK(slots[i].local_rank == i);
    CHECK(slots[i].node_rank == 0);
  }
}

TEST_CASE("ranks on the second node continue after the first node's") {
  LaunchRequest r;
  r.num_nodes = 2;
  r.workers_per_node = 3;
  WorldPlan p = plan_world(r, 0);
  CHECK(p.world_size() == 6);
  auto slots = p.slots_on_node(1);
  CHECK(slots[0].rank == 3);
  CHECK(slots[2].rank == 5);
  CHECK(slots[2].local_rank == 2);
  CHECK(slots[2].node_rank == 1);
  CHECK(p.slot(4).local_rank == 1);
}

TEST_CASE("--gpus-per-node makes GPU workers, one per GPU") {
  LaunchRequest r;
  r.num_nodes = 1;
  r.gpus_per_node = 4;
  WorldPlan p = plan_world(r, 4);
  CHECK(p.workers_per_node == 4);
  CHECK(p.gpu_workers);
}

TEST_CASE("with no count, one worker per GPU, or one worker without GPUs") {
  CHECK(plan_world({}, 3).workers_per_node == 3);
  CHECK(plan_world({}, 3).gpu_workers);
  CHECK(plan_world({}, 0).workers_per_node == 1);
  CHECK_FALSE(plan_world({}, 0).gpu_workers);
}

TEST_CASE("--cpu ignores the GPUs") {
  LaunchRequest r;
  r.total_workers = 8;
  r.cpu_only = true;
  WorldPlan p = plan_world(r, 2);
  CHECK(p.workers_per_node == 8);
  CHECK_FALSE(p.gpu_workers);
}

TEST_CASE("more GPU workers than GPUs is an error naming both numbers, unless shared") {
  LaunchRequest r;
  r.total_workers = 4;
  CHECK_THROWS_WITH_AS(plan_world(r, 2), "4 GPU workers per node but this node has 2 GPU(s)", ddl::UsageError);
  r.share_gpus = true;
  CHECK(plan_world(r, 2).workers_per_node == 4);
}

TEST_CASE("--gpus-per-node without any GPU is an error") {
  LaunchRequest r;
  r.gpus_per_node = 2;
  CHECK_THROWS_WITH_AS(plan_world(r, 0), "--gpus-per-node 2 but this node has no GPU visible", ddl::UsageError);
}

TEST_CASE("contradicting counts are usage errors naming the flags") {
  LaunchRequest a;
  a.total_workers = 5;
  a.num_nodes = 1;
  a.workers_per_node = 4;
  CHECK_THROWS_WITH_AS(plan_world(a, 0), "-np 5 contradicts 1 node(s) x 4 workers per node", ddl::UsageError);
  LaunchRequest b;
  b.workers_per_node = 2;
  b.gpus_per_node = 4;
  CHECK_THROWS_WITH_AS(plan_world(b, 4), "--nproc-per-node 2 contradicts --gpus-per-node 4", ddl::UsageError);
  LaunchRequest c;
  c.total_workers = 3;
  c.num_nodes = 2;
  CHECK_THROWS_WITH_AS(plan_world(c, 0), "-np 3 does not divide evenly over -N 2 nodes", ddl::UsageError);
  c.nodes_from = "Slurm job 5";  // the allocation's nodes, no -N typed: the message names what the user did give
  CHECK_THROWS_WITH_AS(plan_world(c, 0), "-np 3 does not divide evenly over the 2 nodes of Slurm job 5", ddl::UsageError);
  LaunchRequest d;
  d.total_workers = 0;
  CHECK_THROWS_WITH_AS(plan_world(d, 0), "-np must be at least 1, not 0", ddl::UsageError);
  LaunchRequest e;
  e.cpu_only = true;
  e.gpus_per_node = 1;
  CHECK_THROWS_AS(plan_world(e, 1), ddl::UsageError);
}

TEST_CASE("nodes of different sizes: ranks node by node, local ranks per node, Horovod's cross ranks") {
  const WorldPlan p = plan_with_node_sizes({2, 4, 1}, false);
  CHECK(!p.uniform());
  CHECK((p.world_size() == 7 && p.num_nodes == 3 && p.workers_per_node == 4));
  CHECK((p.first_rank_on(0) == 0 && p.first_rank_on(1) == 2 && p.first_rank_on(2) == 6));
  const std::vector<std::array<int, 3>> expected{{0, 0, 0}, {1, 1, 0}, {2, 0, 1}, {3, 1, 1}, {4, 2, 1}, {5, 3, 1}, {6, 0, 2}};
  for (const auto& [rank, local, node] : expected) {
    const WorkerSlot s = p.slot(rank);
    CHECK((s.rank == rank && s.local_rank == local && s.node_rank == node));
  }
  CHECK(p.slots_on_node(1).size() == 4);
  CHECK(p.slots_on_node(2)[0].rank == 6);
  // The cross communicator of a local rank holds one worker per node that has that local rank.
  CHECK((p.cross_size(0) == 3 && p.cross_size(1) == 2 && p.cross_size(2) == 1 && p.cross_size(3) == 1));
  CHECK((p.cross_rank(p.slot(6)) == 2 && p.cross_rank(p.slot(4)) == 0 && p.cross_rank(p.slot(3)) == 1));
  // Equal sizes make an ordinary plan.
  const WorldPlan equal = plan_with_node_sizes({3, 3}, true);
  CHECK((equal.uniform() && equal.workers_per_node == 3 && equal.world_size() == 6 && equal.gpu_workers));
  CHECK((equal.cross_size(2) == 2 && equal.cross_rank(equal.slot(5)) == 1));
}
