#include <doctest/doctest.h>
#include <fmt/format.h>

#include "common/error.hpp"
#include "launcher/host_exclusion.hpp"
#include "launcher/host_list.hpp"
#include "launcher/remote_job.hpp"
#include "launcher/remote_run.hpp"

using namespace ddl::launcher;
using namespace std::string_literals;

namespace {
std::vector<std::pair<std::string, int>> pairs(const std::vector<HostSlots>& hosts) {
  std::vector<std::pair<std::string, int>> out;
  out.reserve(hosts.size());
  for (const auto& h : hosts) out.emplace_back(h.name, h.slots);
  return out;
}
using Pairs = std::vector<std::pair<std::string, int>>;

std::string usage_error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const ddl::UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("-H takes horovodrun's host:slots and mpirun's repeated hosts") {
  CHECK(pairs(parse_host_flag("a:4,b:4")) == Pairs{{"a", 4}, {"b", 4}});
  CHECK(pairs(parse_host_flag("a,a,b")) == Pairs{{"a", 2}, {"b", 1}});
  CHECK(pairs(parse_host_flag(" node-1.cluster:2 , 10.0.0.7:3")) == Pairs{{"node-1.cluster", 2}, {"10.0.0.7", 3}});
  CHECK(usage_error_of([] { parse_host_flag("a:0"); }).find("'a:0' has no whole slot count") != std::string::npos);
  CHECK(usage_error_of([] { parse_host_flag("a:4,,b"); }).find("empty host entry") != std::string::npos);
  CHECK(usage_error_of([] { parse_host_flag("a:99999999999"); }).find("1 to 1048576") != std::string::npos);
  CHECK(usage_error_of([] { parse_host_flag("$(reboot):1"); }).find("is not a host name") != std::string::npos);
  CHECK(usage_error_of([] { parse_host_flag("-oProxyCommand=x"); }).find("is not a host name") != std::string::npos);
  CHECK(usage_error_of([] { parse_host_flag("::1"); }) == "-H: '::1' looks like an IPv6 address, which ddl does not take");
  CHECK(usage_error_of([] { parse_host_flag("node1:4,fe80::1:2"); }).find("'fe80::1:2' looks like an IPv6 address") != std::string::npos);
}

TEST_CASE("host files in the mpirun, deepspeed and horovodrun forms, errors by line") {
  const std::string text = "# cluster\nn1 slots=4\n\nn2 slots=4 max_slots=8  # big\nn3:2\nn4\n";
  CHECK(pairs(parse_hostfile_text(text, "hf")) == Pairs{{"n1", 4}, {"n2", 4}, {"n3", 2}, {"n4", 1}});
  CHECK(usage_error_of([] { parse_hostfile_text("n1 slots=4\nn2 cpus=4\n", "hf"); }) == "--hostfile hf line 2: 'cpus=4' is not slots=N");
  CHECK(usage_error_of([] { parse_hostfile_text("n1 slots=x\n", "hf"); }).find("hf line 1: 'slots=x' needs a whole number") !=
        std::string::npos);
  CHECK(usage_error_of([] { parse_hostfile_text("# nothing\n", "hf"); }) == "--hostfile hf names no host");
  CHECK(usage_error_of([] { parse_hostfile_text("n1 max_slots=2 slots=4\n", "hf"); }) ==
        "--hostfile hf line 1: max_slots=2 is fewer than its 4 slots");  // OpenMPI refuses it too
  CHECK(pairs(parse_hostfile_text("n1 max_slots=4 slots=4\nn2 max_slots=2\n", "hf")) == Pairs{{"n1", 4}, {"n2", 1}});
  CHECK(usage_error_of([] { read_hostfile("/nonexistent/hosts"); }) == "--hostfile /nonexistent/hosts: No such file or directory");
  CHECK(usage_error_of([] { read_hostfile("/dev/zero"); }) == "--hostfile /dev/zero: is larger than 16777216 bytes");  // it never ended
  CHECK(usage_error_of([] { read_hostfile("/tmp"); }) == "--hostfile /tmp: is a directory, not a file");
}

TEST_CASE("planning on hosts: slots, counts and the first hosts first") {
  const std::vector<HostSlots> two_by_4{{"a", 4}, {"b", 4}};
  LaunchRequest cpu;
  cpu.cpu_only = true;
  HostsPlan all = plan_on_hosts(cpu, two_by_4, 0);
  CHECK(all.plan.num_nodes == 2);
  CHECK(all.plan.workers_per_node == 4);

  LaunchRequest np4 = cpu;
  np4.total_workers = 4;
  CHECK(plan_on_hosts(np4, two_by_4, 0).hosts.size() == 1);  // as mpirun fills a's slots first
  np4.total_workers = 6;
  HostsPlan six = plan_on_hosts(np4, two_by_4, 0);
  CHECK((six.plan.num_nodes == 2 && six.plan.workers_per_node == 3));
  np4.total_workers = 9;
  CHECK(usage_error_of([&] { plan_on_hosts(np4, two_by_4, 0); }) == "-np 9 is more than the 8 slots of the hosts");
  np4.total_workers = 5;  // no even spread fits: a's slots first, as mpirun fills them
  HostsPlan five = plan_on_hosts(np4, two_by_4, 0);
  CHECK(five.plan.node_sizes == std::vector<int>{4, 1});
  CHECK((five.plan.world_size() == 5 && five.plan.slot(4).node_rank == 1 && five.plan.slot(4).local_rank == 0));

  LaunchRequest per5 = cpu;
  per5.workers_per_node = 5;
  CHECK(usage_error_of([&] { plan_on_hosts(per5, two_by_4, 0); }) == "host a has 4 slot(s) and 5 workers per host were asked");
  LaunchRequest three_nodes = cpu;
  three_nodes.num_nodes = 3;
  CHECK(usage_error_of([&] { plan_on_hosts(three_nodes, two_by_4, 0); }) == "-N 3 but the host list names 2 host(s)");

  LaunchRequest gpus;
  gpus.gpus_per_node = 4;
  HostsPlan gpu_plan = plan_on_hosts(gpus, two_by_4, 4);
  CHECK((gpu_plan.plan.gpu_workers && gpu_plan.plan.workers_per_node == 4));
}

TEST_CASE("hosts with different slot counts: every slot, or -np filling hosts in order") {
  const std::vector<HostSlots> four_and_two{{"a", 4}, {"b", 2}};
  LaunchRequest cpu;
  cpu.cpu_only = true;
  HostsPlan all = plan_on_hosts(cpu, four_and_two, 0);
  CHECK(all.plan.node_sizes == std::vector<int>{4, 2});
  CHECK((all.plan.world_size() == 6 && all.hosts.size() == 2 && all.plan.first_rank_on(1) == 4));

  LaunchRequest np = cpu;
  np.total_workers = 6;
  CHECK(plan_on_hosts(np, four_and_two, 0).plan.node_sizes == std::vector<int>{4, 2});
  np.total_workers = 3;  // 3 does not spread evenly over 1 or 2 hosts within b's 2 slots
  CHECK(plan_on_hosts(np, {{"a", 2}, {"b", 1}}, 0).plan.node_sizes == std::vector<int>{2, 1});
  np.total_workers = 4;  // fits a alone
  HostsPlan on_a = plan_on_hosts(np, four_and_two, 0);
  CHECK((on_a.hosts.size() == 1 && on_a.plan.uniform() && on_a.plan.workers_per_node == 4));
  np.total_workers = 7;
  CHECK(usage_error_of([&] { plan_on_hosts(np, four_and_two, 0); }) == "-np 7 is more than the 6 slots of the hosts");
  const std::vector<HostSlots> huge(20, {"h", 1 << 20});
  CHECK(usage_error_of([&] { plan_on_hosts(cpu, huge, 0); }) ==
        "every slot of the hosts makes 20971520 workers, more than the 16777216 one run can have");
  np.total_workers = 8;  // -np within the slots: the sum of the slots does not matter
  CHECK(plan_on_hosts(np, huge, 0).plan.world_size() == 8);
  LaunchRequest per_host = cpu;
  per_host.workers_per_node = 1 << 20;
  CHECK(usage_error_of([&] { plan_on_hosts(per_host, huge, 0); }) ==
        "the hosts times the count per host make 20971520 workers, more than the 16777216 one run can have");

  LaunchRequest first_three = cpu;  // -N 3: every slot of the first three hosts
  first_three.num_nodes = 3;
  CHECK(plan_on_hosts(first_three, {{"a", 2}, {"b", 3}, {"c", 1}, {"d", 8}}, 0).plan.node_sizes == std::vector<int>{2, 3, 1});
  first_three.total_workers = 4;
  CHECK(usage_error_of([&] {
          plan_on_hosts(first_three, {{"a", 2}, {"b", 3}, {"c", 1}}, 0);
        }) == "-np 4 fills the slots of only 2 of the -N 3 hosts");
  first_three.total_workers = 6;
  CHECK(plan_on_hosts(first_three, {{"a", 2}, {"b", 3}, {"c", 2}}, 0).plan.workers_per_node == 2);  // even: 2 on each

  // A count per host is still the same on each, and a host with fewer slots is named.
  LaunchRequest per3 = cpu;
  per3.workers_per_node = 3;
  CHECK(usage_error_of([&] { plan_on_hosts(per3, four_and_two, 0); }) == "host b has 2 slot(s) and 3 workers per host were asked");

  // GPU workers: each host checks its own GPUs against its own count when it starts them (the
  // launching host in run_on_hosts, naming itself), not against another host's here.
  HostsPlan gpu_plan = plan_on_hosts(LaunchRequest{}, four_and_two, 1);
  CHECK((gpu_plan.plan.gpu_workers && gpu_plan.plan.node_sizes == std::vector<int>{4, 2}));
  // The same where every host has as many slots: the plan is uniform and still not checked here.
  HostsPlan even_gpu_plan = plan_on_hosts(LaunchRequest{}, {{"a", 4}, {"b", 4}}, 1);
  CHECK((even_gpu_plan.plan.gpu_workers && even_gpu_plan.plan.uniform() && even_gpu_plan.plan.workers_per_node == 4));
  LaunchRequest on_cpus = cpu;  // --cpu: no GPU workers whatever this host has
  CHECK_FALSE(plan_on_hosts(on_cpus, four_and_two, 4).plan.gpu_workers);
}

TEST_CASE("the job a remote host's agent reads round-trips, and the launching host's own variables stay home") {
  RemoteJob job;
  job.node_rank = 1;
  job.plan = {2, 3, true};
  job.gpu_order = GpuOrder::Reversed;
  job.cpus_per_task = 8;
  job.run = {"ddl-1", "10.0.0.1:5000", "secret", "10.0.0.1", 29500, 1};
  job.command = {"python3", "train.py", "--lr", "0.1 'quoted'"};
  job.working_dir = "/home/me/run";
  job.env = forwarded_environment({{"PATH", "/bin"},
                                   {"HOSTNAME", "login1"},
                                   {"CUDA_VISIBLE_DEVICES", "0"},
                                   {"SLURM_JOB_ID", "7"},
                                   {"PWD", "/x"},
                                   {"SSH_CONNECTION", "a b"},
                                   {"NCCL_DEBUG", "INFO"}});
  const RemoteJob back = decode_remote_job(encode_remote_job(job));
  CHECK(back.node_rank == 1);
  CHECK((back.plan.num_nodes == 2 && back.plan.workers_per_node == 3 && back.plan.gpu_workers));
  CHECK(back.gpu_order == GpuOrder::Reversed);
  CHECK(back.cpus_per_task == 8);
  CHECK((back.run.store_addr == "10.0.0.1:5000" && back.run.store_token == "secret" && back.run.master_port == 29500));
  CHECK(back.command == job.command);
  CHECK(back.env == ddl::Environment{{"PATH", "/bin"}, {"NCCL_DEBUG", "INFO"}});
  CHECK_THROWS_AS(decode_remote_job("{\"format\": 1}"), ddl::Error);
  CHECK_THROWS_AS(decode_remote_job("{\"format\": 2}"), ddl::Error);
  CHECK_THROWS_AS(decode_remote_job("not json"), ddl::Error);
  CHECK(encode_remote_job(job).find('\n') == std::string::npos);
  CHECK(back.plan.uniform());

  // Any bytes, UTF-8 or not, arrive as they were sent: words, variables and the directory.
  job.command = {"python3", "\xff\xfe", "caf\xc3\xa9", "", "a\x01b", "\xc3"};
  job.working_dir = "/home/me/\x80run";
  job.env = {{"BYTES", "\xff\xfe\x80"}, {"NAME\xff", "v"}, {"UTF8", "\xe2\x9c\x93"}};
  const RemoteJob bytes = decode_remote_job(encode_remote_job(job));
  CHECK(bytes.command == job.command);
  CHECK(bytes.working_dir == job.working_dir);
  CHECK(bytes.env == job.env);
  std::string odd = encode_remote_job(job);
  odd.replace(odd.find("\"hex\":\"ff"), 11, "\"hex\":\"fg");
  CHECK_THROWS_AS(decode_remote_job(odd), ddl::Error);

  // A job no ddl run writes is refused, naming what is wrong, rather than half-used.
  const auto refusal = [&](const std::string& from, const std::string& to) {
    std::string changed = encode_remote_job(job);
    REQUIRE(changed.find(from) != std::string::npos);
    changed.replace(changed.find(from), from.size(), to);
    try {
      decode_remote_job(changed);
    } catch (const ddl::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal("\"master_port\":29500", "\"master_port\":70000") == "the launching host sent a master_port out of range");
  CHECK(refusal("\"node_rank\":1", "\"node_rank\":0.9") == "the launching host sent a node_rank that is not a whole number");
  CHECK(refusal("\"workers_per_node\":3", "\"workers_per_node\":100000000") == "the launching host sent a workers_per_node out of range");
  CHECK(refusal("\"grace_period_ms\":10000", "\"grace_period_ms\":-1") == "the launching host sent a grace_period_ms out of range");
  CHECK(refusal("\"cpus_per_task\":8", "\"cpus_per_task\":0") == "the launching host sent a cpus_per_task out of range");
  CHECK(refusal("\"command\":[", "\"command\":\"sh\",\"unused\":[") == "the launching host sent a command that is not a list of words");
  CHECK(refusal("\"hex\":\"fffe\"", "\"hex\":\"ff00\"") == "the launching host sent a word with a NUL byte");
  CHECK(refusal("[\"BYTES\",", "[\"A=B\",") == "the launching host sent a variable name that is empty or holds '='");

  job.plan = plan_with_node_sizes({4, 2}, false);
  const RemoteJob unequal = decode_remote_job(encode_remote_job(job));
  CHECK((unequal.plan.node_sizes == std::vector<int>{4, 2} && unequal.plan.workers_on(1) == 2 && unequal.plan.world_size() == 6));
  std::string wrong = encode_remote_job(job);
  wrong.replace(wrong.find("[4,2]"), 5, "[4,0]");
  CHECK_THROWS_AS(decode_remote_job(wrong), ddl::Error);
}

TEST_CASE("--exclude: names and short names left out in order, unknown names said, none left an error") {
  std::vector<std::string> notes;
  auto note = [&](const std::string& line) { notes.push_back(line); };
  const HostExclusion exclusion("nid002,nid009.chn.site.gov", nullptr);
  CHECK(exclusion.covers("nid002"));
  CHECK(exclusion.covers("nid002.chn.site.gov"));
  CHECK(exclusion.covers("nid009"));
  CHECK_FALSE(exclusion.covers("nid0021"));
  const std::vector<std::string> hosts{"nid001.chn.site.gov", "nid002.chn.site.gov", "nid003.chn.site.gov"};
  CHECK(exclusion.hosts_left(hosts, "the hosts", note) == std::vector<std::string>{"nid001.chn.site.gov", "nid003.chn.site.gov"});
  REQUIRE(notes.size() == 2);
  CHECK(notes[0] ==
        "--exclude nid009.chn.site.gov: not among the hosts (nid001.chn.site.gov,nid002.chn.site.gov,nid003.chn.site.gov); "
        "nothing to leave out for it");
  CHECK(notes[1] == "leaving out 1 of the hosts: running on nid001.chn.site.gov,nid003.chn.site.gov");

  const std::vector<HostSlots> slots{{"a", 4}, {"b", 2}, {"c", 8}};
  CHECK(pairs(HostExclusion("b", nullptr).hosts_left(slots, "-H's hosts", nullptr)) == Pairs{{"a", 4}, {"c", 8}});
  CHECK(usage_error_of([&] { HostExclusion("a,b,c", nullptr).hosts_left(slots, "-H's hosts", nullptr); }) ==
        "--exclude a,b,c leaves none of -H's hosts (a,b,c)");
}

TEST_CASE("--exclude: a Slurm node range needs Slurm to expand it; names are checked, addresses match only themselves") {
  CHECK(usage_error_of([] { HostExclusion("nid[001-003]", nullptr); }) ==
        "--exclude nid[001-003]: a node range is read by Slurm for the nodes of a Slurm allocation only");
  const HostExclusion expanded("nid[001-002]", [](const std::string& range) {
    CHECK(range == "nid[001-002]");
    return std::vector<std::string>{"nid001", "nid002"};
  });
  CHECK(expanded.names() == std::vector<std::string>{"nid001", "nid002"});
  CHECK(usage_error_of([] {
          HostExclusion("nid[001-", [](const std::string&) -> std::vector<std::string> { throw ddl::Error("scontrol: bad", "hint"); });
        }) == "--exclude nid[001-: not a Slurm node list (scontrol: bad)");
  CHECK(usage_error_of([] { HostExclusion("a,,b", nullptr); }) == "--exclude 'a,,b': '' is not a host name");
  CHECK(usage_error_of([] { HostExclusion("a,", nullptr); }) == "--exclude 'a,': '' is not a host name");
  CHECK(usage_error_of([] { HostExclusion("a;rm -rf /", nullptr); }) == "--exclude 'a;rm -rf /': 'a;rm -rf /' is not a host name");
  CHECK(usage_error_of([] { HostExclusion("node7:4", nullptr); }) == "--exclude node7:4: a host name, without -H's slot count");
  CHECK(HostExclusion("a, b", nullptr).names() == std::vector<std::string>{"a", "b"});
  // 10.0.0.1's "short name" is not 10: an address is one host.
  const HostExclusion address("10.0.0.2", nullptr);
  CHECK_FALSE(address.covers("10.0.0.1"));
  CHECK(address.covers("10.0.0.2"));
  CHECK(address.hosts_left({"10.0.0.1", "10.0.0.2", "10.0.0.3"}, "the hosts", nullptr) == std::vector<std::string>{"10.0.0.1", "10.0.0.3"});
}

TEST_CASE("--exclude: what is said of thousands of nodes is the first few and a count") {
  std::vector<std::string> hosts;
  for (int i = 0; i < 5000; ++i) hosts.push_back(fmt::format("nid{:06}", i));
  std::vector<std::string> notes;
  HostExclusion("nid000000", nullptr).hosts_left(hosts, "the nodes", [&](const std::string& line) { notes.push_back(line); });
  REQUIRE(notes.size() == 1);
  CHECK(notes[0] ==
        "leaving out 1 of the nodes: running on nid000001,nid000002,nid000003,nid000004,nid000005,nid000006,nid000007,"
        "nid000008,... (4999 in all)");
}
