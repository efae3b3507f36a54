// Site profiles and the batch scripts rendered from them: every built-in site against its golden
// file (tests/fixtures/scripts, reviewed line by line against ../shared/SITES.md), each site rule,
// user overrides, and broken profiles. DDL_UPDATE_GOLDEN=1 rewrites the golden files.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/job_script.hpp"
#include "backends/jupyter_session.hpp"
#include "backends/site_profile.hpp"
#include "common/bounded_regex.hpp"
#include "common/environment.hpp"
#include "common/error.hpp"

using namespace ddl::backends;
namespace fs = std::filesystem;

namespace {

JobRequest job(std::map<std::string, std::string> options) {
  JobRequest j;
  j.options = std::move(options);
  j.command = {"python3", "train.py", "--epochs", "3"};
  j.ddl_program = "ddl";
  j.ddl_version = "VERSION";
  return j;
}

void check_golden(const std::string& name, const std::string& site, const JobRequest& request) {
  const fs::path golden = fs::path(DDL_SOURCE_ROOT) / "tests" / "fixtures" / "scripts" / (name + ".sh");
  const std::string rendered = render_job_script(load_site(site), request).text;
  if (std::getenv("DDL_UPDATE_GOLDEN") != nullptr) {
    fs::create_directories(golden.parent_path());
    std::ofstream(golden) << rendered;
  }
  std::ifstream in(golden);
  REQUIRE_MESSAGE(in.good(), "missing golden file " << golden << " (DDL_UPDATE_GOLDEN=1 writes it)");
  std::stringstream expected;
  expected << in.rdbuf();
  CHECK_MESSAGE(rendered == expected.str(), "rendered script for " << name << " differs from " << golden);
}

// Points $XDG_CONFIG_HOME at a fresh directory holding `files` (site name -> JSON text).
struct UserSites {
  fs::path dir = fs::temp_directory_path() / "ddl_unit_user_sites";
  explicit UserSites(const std::map<std::string, std::string>& files) {
    fs::remove_all(dir);
    fs::create_directories(dir / "ddl" / "sites");
    for (const auto& [name, text] : files) std::ofstream(dir / "ddl" / "sites" / (name + ".json")) << text;
    ::setenv("XDG_CONFIG_HOME", dir.c_str(), 1);
  }
  ~UserSites() {
    ::unsetenv("XDG_CONFIG_HOME");
    fs::remove_all(dir);
  }
};

}  // namespace

TEST_CASE("every built-in site renders its golden script") {
  UserSites none({});
  check_golden("perlmutter", "perlmutter", job({{"nodes", "2"}, {"time", "01:00:00"}, {"account", "m1234_g"}, {"queue", "regular"}}));
  JobRequest shifter = job({{"nodes", "2"}, {"account", "m1234_g"}, {"image", "nersc/pytorch:24.06.01"}});
  shifter.signal_before_seconds = 300;
  shifter.requeue = true;
  shifter.max_requeues = 3;
  check_golden("perlmutter_shifter_checkpoint", "perlmutter", shifter);
  check_golden("neuron", "neuron", job({{"nodes", "2"}, {"partition", "amd_a100nv_8"}, {"comment", "pytorch"}, {"time", "02:00:00"}}));
  check_golden("polaris", "polaris", job({{"nodes", "2"}, {"account", "MyProject"}, {"filesystems", "home:eagle"}, {"time", "01:00:00"}}));
  check_golden("polaris_apptainer", "polaris",
               job({{"nodes", "1"}, {"account", "MyProject"}, {"filesystems", "home:grand"}, {"image", "/eagle/p/img.sif"}}));
  check_golden("sockeye", "sockeye", job({{"nodes", "2"}, {"account", "st-alice-1-gpu"}, {"time", "01:00:00"}}));
  check_golden("alliance", "alliance", job({{"nodes", "2"}, {"account", "def-alice"}, {"time", "03:00:00"}}));
  check_golden("slurm", "slurm", job({{"nodes", "2"}, {"gpus_per_node", "4"}, {"job_name", "it's mine $(id)"}}));
  check_golden("pbs", "pbs", job({{"nodes", "2"}, {"gpus_per_node", "4"}, {"cpus_per_task", "8"}}));
}

TEST_CASE("ddl jupyter's scripts: PBS (Polaris) and Slurm (Perlmutter) golden files") {
  UserSites none({});
  JupyterSession session;
  session.name = "jupyter-0123456789ab";
  session.dir = "/home/alice/.local/state/ddl/jupyter";
  session.program = "lab";
  JobRequest polaris = job({{"nodes", "1"},
                            {"gpus_per_node", "1"},
                            {"account", "MyProject"},
                            {"filesystems", "home:eagle"},
                            {"job_name", "ddl-jupyter"},
                            {"time", "01:00:00"}});  // the debug queue's most
  polaris.command.clear();
  polaris.body = jupyter_body(session, "base");
  check_golden("polaris_jupyter", "polaris", polaris);
  JobRequest perlmutter = job({{"nodes", "1"}, {"gpus_per_node", "1"}, {"account", "m1234_g"}, {"job_name", "ddl-jupyter"}});
  perlmutter.command.clear();
  perlmutter.body = jupyter_body(session, "/global/common/software/m1234/venv");
  check_golden("perlmutter_jupyter", "perlmutter", perlmutter);
}

TEST_CASE("each site's rules are one usage error naming the rule and the fix") {
  UserSites none({});
  auto refuse = [](const std::string& site, std::map<std::string, std::string> options, const char* says) {
    CHECK_THROWS_WITH_AS(render_job_script(load_site(site), job(std::move(options))), doctest::Contains(says), ddl::UsageError);
  };
  refuse("polaris", {{"filesystems", "home"}}, "site 'polaris' requires -A/--account");
  refuse("polaris", {{"account", "p"}}, "site 'polaris' requires --filesystems");
  refuse("polaris", {{"account", "p"}, {"filesystems", "home"}, {"queue", "regular"}}, "Polaris' queues are");
  refuse("neuron", {}, "site 'neuron' requires --comment");
  refuse("neuron", {{"comment", "pytorch"}, {"mem", "100G"}}, "site 'neuron' does not allow --mem");
  refuse("neuron", {{"comment", "pytorch"}, {"partition", "cas_v100_2"}, {"gpus_per_node", "4"}},
         "site 'neuron' partition cas_v100_2 has 2 GPUs per node");
  refuse("perlmutter", {{"account", "m1234"}}, "written <project>_g");
  refuse("perlmutter", {{"account", "m1234_g"}, {"gpus_per_node", "8"}}, "site 'perlmutter' has 4 GPUs per node");
  refuse("perlmutter", {{"account", "m1234_g"}, {"time", "an hour"}}, "-t/--time an hour: not a time limit");
  refuse("alliance", {{"account", "alice"}}, "Alliance accounts are written def-<pi>");
  refuse("sockeye", {{"account", "st-alice-1-gpu"}, {"output", "/scratch/a'b\"c.out"}}, "holds both kinds of quote");
  refuse("sockeye", {{"account", "st-alice-1-gpu"}, {"job_name", "my run"}},
         "-J/--job-name 'my run': PBS takes a job name of letters, digits and - _ + . only, at most 230 of them");
  refuse("slurm", {{"account", "x\ny"}}, "-A/--account contains a newline");
  refuse("perlmutter", {{"account", "m1_g"}, {"gpus_per_node", "abc"}}, "--gpus-per-node abc: must be a whole number");
  refuse("slurm", {{"image", "x.sif"}}, "--image: site 'slurm' (slurm) has no place for it");
  refuse("polaris", {{"account", "p"}, {"filesystems", "home"}, {"partition", "gpu"}},
         "-p/--partition: site 'polaris' (pbs) has no place for it");
  refuse("pbs", {{"gpus_per_node", "4"}}, "site 'pbs' needs -c/--cpus-per-task for its select statement");
  JobRequest pbs_signal = job({{"account", "st-a-1-gpu"}});
  pbs_signal.signal_before_seconds = 60;
  CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), pbs_signal), doctest::Contains("uses PBS"), ddl::UsageError);
  JobRequest pbs_count = job({{"account", "st-a-1-gpu"}});
  pbs_count.requeue = true;
  pbs_count.max_requeues = 2;
  CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), pbs_count), doctest::Contains("--max-requeues: site 'sockeye' uses PBS"),
                       ddl::UsageError);
  JobRequest pbs_named_signal = job({{"account", "st-a-1-gpu"}});
  pbs_named_signal.requeue = true;
  pbs_named_signal.signal = "USR2";
  CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), pbs_named_signal), doctest::Contains("--signal: site 'sockeye' uses PBS"),
                       ddl::UsageError);
}

TEST_CASE("--exclude: Slurm's directive with names and ranges; anything else, or a PBS site, is refused") {
  JobRequest slurm_job = job({{"account", "m1_g"}});
  slurm_job.exclude = "nid001234,nid[002000-002003]";
  CHECK(render_job_script(load_site("perlmutter"), slurm_job).text.find("#SBATCH --exclude=nid001234,nid[002000-002003]\n") !=
        std::string::npos);
  for (const char* bad : {"a b", "x;rm -rf ~", ",a", "a,", "a,,b", "$(id)"}) {
    slurm_job.exclude = bad;
    CHECK_THROWS_WITH_AS(render_job_script(load_site("perlmutter"), slurm_job), doctest::Contains("is not a Slurm node list"),
                         ddl::UsageError);
  }
  slurm_job.exclude = std::string(100000, 'a');
  CHECK_THROWS_WITH_AS(render_job_script(load_site("perlmutter"), slurm_job),
                       doctest::Contains("--exclude: a list of 100000 characters is too long for a directive"), ddl::UsageError);
  // Slurm's file form: a readable file, or an error naming it.
  slurm_job.exclude = DDL_SOURCE_ROOT "/README.md";
  CHECK(render_job_script(load_site("perlmutter"), slurm_job).text.find("#SBATCH --exclude=" DDL_SOURCE_ROOT "/README.md\n") !=
        std::string::npos);
  slurm_job.exclude = "/nonexistent/bad-nodes";
  CHECK_THROWS_WITH_AS(render_job_script(load_site("perlmutter"), slurm_job),
                       doctest::Contains("--exclude /nonexistent/bad-nodes: Slurm reads a value with '/' as a file of node names"),
                       ddl::UsageError);
  JobRequest pbs_job = job({{"account", "st-a-1-gpu"}});
  pbs_job.exclude = "node7";
  CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), pbs_job),
                       doctest::Contains("--exclude: site 'sockeye' uses PBS, which cannot keep a job off named nodes"), ddl::UsageError);
}

TEST_CASE("--requeue: Slurm's signal goes to ddl run, which requeues; PBS gets a rerunnable job") {
  UserSites none({});
  JobRequest requeue = job({{"nodes", "1"}, {"gpus_per_node", "4"}});
  requeue.requeue = true;
  std::string text = render_job_script(load_site("slurm"), requeue).text;
  CHECK(text.find("#SBATCH --signal=B:USR1@" + std::to_string(kRequeueSignalBefore) + "\n") != std::string::npos);
  CHECK(text.find("#SBATCH --requeue\n") != std::string::npos);
  CHECK(text.find("#SBATCH --open-mode=append\n") != std::string::npos);
  CHECK(text.find(" --requeue-signal USR1 -- python3 train.py") != std::string::npos);

  requeue.signal = "USR2";
  requeue.signal_before_seconds = 200;
  requeue.max_requeues = 0;
  text = render_job_script(load_site("slurm"), requeue).text;
  CHECK(text.find("#SBATCH --signal=B:USR2@200\n") != std::string::npos);
  CHECK(text.find(" --requeue-signal USR2 --max-requeues 0 -- ") != std::string::npos);

  JobRequest signal_only = job({{"nodes", "1"}, {"gpus_per_node", "4"}});
  signal_only.signal_before_seconds = 90;
  text = render_job_script(load_site("slurm"), signal_only).text;
  CHECK(text.find("#SBATCH --signal=B:USR1@90\n") != std::string::npos);
  CHECK(text.find("--requeue") == std::string::npos);  // the signal alone requeues nothing

  JobRequest pbs = job({{"nodes", "2"}, {"gpus_per_node", "4"}, {"cpus_per_task", "8"}});
  pbs.requeue = true;
  text = render_job_script(load_site("pbs"), pbs).text;
  CHECK(text.find("#PBS -r y\n") != std::string::npos);
  CHECK(text.find("--requeue-signal") == std::string::npos);
}

TEST_CASE("--requeue and --signal-before need a time limit longer than the signal's lead") {
  UserSites none({});
  JobRequest requeue = job({{"nodes", "1"}, {"gpus_per_node", "4"}, {"time", "2"}});
  requeue.requeue = true;  // lead 120 s in a 120 s job: signalled as it starts, requeued over and over
  CHECK_THROWS_WITH_AS(render_job_script(load_site("slurm"), requeue),
                       doctest::Contains("--requeue signals 120 s before the time limit, and -t/--time 2 is 120 s: the job would be told "
                                         "to stop as it starts"),
                       ddl::UsageError);
  requeue.options["time"] = "2:01";
  CHECK(render_job_script(load_site("slurm"), requeue).text.find("#SBATCH --time=2:01\n") != std::string::npos);
  requeue.options["time"] = "0";  // no limit: the signal never comes
  CHECK_THROWS_WITH_AS(render_job_script(load_site("slurm"), requeue),
                       doctest::Contains("--requeue with -t/--time 0: Slurm reads 0 as no time limit"), ddl::UsageError);

  JobRequest signal_only = job({{"nodes", "1"}, {"gpus_per_node", "4"}, {"time", "00:30:00"}});
  signal_only.signal_before_seconds = 1800;
  try {
    render_job_script(load_site("slurm"), signal_only);
    FAIL("a lead as long as the job was accepted");
  } catch (const ddl::UsageError& e) {
    CHECK(std::string(e.what()) ==
          "--signal-before 1800 signals 1800 s before the time limit, and -t/--time 00:30:00 is 1800 s: the job would be told to stop "
          "as it starts");
  }
  signal_only.options.erase("time");  // the partition's default limit: nothing to check against
  CHECK(render_job_script(load_site("slurm"), signal_only).text.find("#SBATCH --signal=B:USR1@1800\n") != std::string::npos);
}

namespace {

// How sbatch 22.05 reads the words of an #SBATCH line (get_argument in src/sbatch/opt.c): blanks
// split words, quotes group, a backslash escapes the next character inside quotes too, and an
// unquoted # starts a comment.
std::vector<std::string> sbatch_words(const std::string& line) {
  std::vector<std::string> words;
  size_t at = 0;
  while (true) {
    while (at < line.size() && std::isspace(static_cast<unsigned char>(line[at]))) ++at;
    if (at == line.size()) return words;
    std::string word;
    char quote = 0;
    bool escaped = false;
    for (; at < line.size() && (quote || !std::isspace(static_cast<unsigned char>(line[at]))); ++at) {
      const char c = line[at];
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
        continue;
      } else if (quote) {
        if (c == quote) {
          quote = 0;
          continue;
        }
      } else if (c == '"' || c == '\'') {
        quote = c;
        continue;
      } else if (c == '#') {
        return words;
      }
      word += c;
    }
    REQUIRE_MESSAGE(!quote, "sbatch: unmatched quote in " << line);
    words.push_back(word);
  }
}

// The words sbatch reads from the script's #SBATCH lines.
std::vector<std::string> sbatch_arguments(const std::string& script) {
  std::vector<std::string> arguments;
  std::istringstream lines(script);
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("#SBATCH"))
      for (auto& word : sbatch_words(line.substr(7))) arguments.push_back(word);
  return arguments;
}

}  // namespace

TEST_CASE("sbatch reads back exactly the values in #SBATCH lines: backslashes, quotes, blanks and # included") {
  UserSites none({});
  for (const std::string value : {"a\\b", "ends in \\", "\\", "\\\\x", "say \"hi\"", "it's \"both\"", "a#b", "\\\"", "x  y", "\\n"}) {
    CAPTURE(value);
    const std::string script =
        render_job_script(load_site("slurm"), job({{"job_name", value}, {"comment", value}, {"output", "/tmp/x/dir-" + value + ".out"}}))
            .text;
    const auto arguments = sbatch_arguments(script);
    CHECK(std::find(arguments.begin(), arguments.end(), "--job-name=" + value) != arguments.end());
    CHECK(std::find(arguments.begin(), arguments.end(), "--comment=" + value) != arguments.end());
    CHECK(std::find(arguments.begin(), arguments.end(), "--output=/tmp/x/dir-" + value + ".out") != arguments.end());
  }
  CHECK(render_job_script(load_site("slurm"), job({{"job_name", "a\\b \"c\""}})).text.find("#SBATCH --job-name=\"a\\\\b \\\"c\\\"\"\n") !=
        std::string::npos);
}

// sbatch and qsub refuse these; ddl says which part and how to write it before submitting.
TEST_CASE("array ranges that end before they start, steps and limits of 0 are refused") {
  UserSites none({});
  auto refused = [](const std::string& site, std::map<std::string, std::string> options, const std::string& spec, const char* says) {
    JobRequest j = job(std::move(options));
    j.array = spec;
    CHECK_THROWS_WITH_AS(render_job_script(load_site(site), j), doctest::Contains(says), ddl::UsageError);
  };
  refused("slurm", {}, "3-1", "--array '3-1': the range 3-1 ends before it starts");
  refused("slurm", {}, "1,9-5:2", "the range 9-5:2 ends before it starts");
  refused("slurm", {}, "0-3:0", "--array '0-3:0': the range 0-3:0 has a step of 0");
  refused("slurm", {}, "0-15%0", "--array '0-15%0': a limit of 0 elements at once would run none");
  refused("sockeye", {{"account", "st-a-1-gpu"}}, "0-3:0", "has a step of 0");
  refused("sockeye", {{"account", "st-a-1-gpu"}}, "0-3%0", "a limit of 0 elements");
  JobRequest fine = job({});
  fine.array = "0,2-2,4-10:3%1";
  CHECK(render_job_script(load_site("slurm"), fine).text.find("#SBATCH --array=0,2-2,4-10:3%1\n") != std::string::npos);
}

// Nodes are shared on Neuron (SITES.md): a part of a node's GPUs takes that part of its cores.
TEST_CASE("a job with part of a node's GPUs asks for that part of the node's cores") {
  UserSites none({});
  auto cpus_per_task = [](const std::string& gpus) {
    const std::string text =
        render_job_script(load_site("neuron"), job({{"comment", "pytorch"}, {"partition", "amd_a100nv_8"}, {"gpus_per_node", gpus}})).text;
    const size_t at = text.find("#SBATCH --cpus-per-task=");
    REQUIRE(at != std::string::npos);
    return std::stoi(text.substr(at + 24));
  };
  CHECK(cpus_per_task("1") == 8);  // 64 cores, 8 GPUs: 8 cores per GPU, not the node's 64
  CHECK(cpus_per_task("2") == 8);
  CHECK(cpus_per_task("8") == 8);   // the whole node
  CHECK(cpus_per_task("0") == 64);  // a CPU job: the node's cores
  const std::string given =
      render_job_script(load_site("neuron"),
                        job({{"comment", "pytorch"}, {"partition", "amd_a100nv_8"}, {"gpus_per_node", "1"}, {"cpus_per_task", "32"}}))
          .text;
  CHECK(given.find("#SBATCH --cpus-per-task=32\n") != std::string::npos);  // the user's own stands
}

// OpenPBS: qsub refuses other names (check_job_name), and places chunks freely unless told.
TEST_CASE("PBS: job names as qsub takes them; N nodes' chunks on N hosts") {
  UserSites none({});
  for (const char* name : {"exp:1", "a/b", "x@y", "a,b", "a&b", "\"q\"", "é"})
    CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"job_name", name}})),
                         doctest::Contains("PBS takes a job name of letters, digits and - _ + . only"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(render_job_script(load_site("pbs"), job({{"cpus_per_task", "4"}, {"job_name", std::string(231, 'a')}})),
                       doctest::Contains("at most 230 of them"), ddl::UsageError);
  CHECK(render_job_script(load_site("pbs"), job({{"cpus_per_task", "4"}, {"job_name", "2-resnet_50+v1.2"}}))
            .text.find("#PBS -N 2-resnet_50+v1.2\n") != std::string::npos);
  CHECK(render_job_script(load_site("slurm"), job({{"job_name", "my run"}})).text.find("#SBATCH --job-name=\"my run\"\n") !=
        std::string::npos);  // Slurm takes any name

  const std::string two = render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"nodes", "2"}})).text;
  CHECK(two.find("#PBS -l place=scatter\n") != std::string::npos);
  CHECK(render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"nodes", "1"}})).text.find("place=") == std::string::npos);
  JobRequest told = job({{"nodes", "2"}, {"cpus_per_task", "4"}});
  told.extra_directives = {"-l place=excl"};  // the user's own placement stands alone
  const std::string excl = render_job_script(load_site("pbs"), told).text;
  CHECK(excl.find("place=scatter") == std::string::npos);
  CHECK(excl.find("#PBS -l place=excl\n") != std::string::npos);
  const std::string polaris =
      render_job_script(load_site("polaris"), job({{"account", "p"}, {"filesystems", "home"}, {"nodes", "2"}})).text;
  CHECK(polaris.find("place=scatter") == polaris.rfind("place=scatter"));  // its profile's own, once
}

TEST_CASE("a #PBS directive value with a backslash is refused, naming the flag") {
  UserSites none({});
  CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"output", "/scratch/a\\b.out"}})),
                       "-o/--output contains a backslash, which qsub does not read the same way on every PBS", ddl::UsageError);
  CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"output", "/scratch/a'b\"c.out"}})),
                       "-o/--output holds both kinds of quote, which a #PBS directive cannot carry", ddl::UsageError);
}

TEST_CASE("values of tens of kilobytes are refused or quoted, never a crash") {
  UserSites none({});
  const std::string huge(40000, 'a');
  CHECK_THROWS_WITH_AS(render_job_script(load_site("perlmutter"), job({{"account", huge}})),
                       "-A/--account is 40000 characters long; a batch directive value may have at most 1024", ddl::UsageError);
  CHECK_THROWS_WITH_AS(render_job_script(load_site("perlmutter"), job({{"account", "m1_g"}, {"time", std::string(40000, '1')}})),
                       doctest::Contains("-t/--time is 40000 characters long"), ddl::UsageError);
  JobRequest long_argument = job({{"account", "m1234_g"}});
  long_argument.command.push_back(huge + " and a space");
  const std::string text = render_job_script(load_site("perlmutter"), long_argument).text;
  CHECK(text.find("'" + huge + " and a space'") != std::string::npos);
}

TEST_CASE("PBS gets Slurm's time forms as HH:MM:SS walltime") {
  UserSites none({});
  auto walltime = [](const std::string& time) {
    const std::string text = render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"time", time}})).text;
    const auto at = text.find("walltime=");
    return text.substr(at + 9, text.find('\n', at) - at - 9);
  };
  CHECK(walltime("30") == "00:30:00");
  CHECK(walltime("90:30") == "01:30:30");
  CHECK(walltime("01:00:00") == "01:00:00");
  CHECK(walltime("1-00:00:00") == "24:00:00");
  CHECK(walltime("2-12") == "60:00:00");
  CHECK(walltime("1-02:30") == "26:30:00");
  CHECK(walltime("2880") == "48:00:00");  // more than 3 digits of minutes, and single digits, as sbatch takes them
  CHECK(walltime("1:5") == "00:01:05");
  CHECK(walltime("1:2:3") == "01:02:03");
}

TEST_CASE("a zero time limit (Slurm: none) is a usage error on PBS, which cannot ask for none") {
  UserSites none({});
  for (const std::string zero : {"0", "00:00", "00:00:00", "0-0", "0-00:00:00"}) {
    CAPTURE(zero);
    CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"time", zero}})),
                         ("-t/--time " + zero + ": PBS has no \"no time limit\" (Slurm's meaning of 0) to ask for").c_str(),
                         ddl::UsageError);
  }
  CHECK(render_job_script(load_site("slurm"), job({{"time", "0"}})).text.find("#SBATCH --time=0\n") != std::string::npos);
  CHECK(render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"time", "0:01"}})).text.find("walltime=00:00:01\n") !=
        std::string::npos);
}

TEST_CASE("a container image that starts with '-' is refused: the container command would read it as an option") {
  UserSites none({});
  CHECK_THROWS_WITH_AS(
      render_job_script(load_site("polaris"), job({{"account", "p"}, {"filesystems", "home"}, {"image", "--bind=/:/host"}})),
      "--image --bind=/:/host: starts with '-', so the container command (apptainer) would read it as an option", ddl::UsageError);
  CHECK_THROWS_WITH_AS(render_job_script(load_site("neuron"), job({{"comment", "pytorch"}, {"image", "-x.sif"}})),
                       doctest::Contains("(singularity) would read it as an option"), ddl::UsageError);
  const std::string text =
      render_job_script(load_site("polaris"), job({{"account", "p"}, {"filesystems", "home"}, {"image", "./-x.sif"}})).text;
  CHECK(text.find(" -- apptainer exec --nv ./-x.sif python3 train.py") != std::string::npos);
  // Shifter names the image in a directive (--image=...), where a leading '-' is no option.
  CHECK(render_job_script(load_site("perlmutter"), job({{"account", "m1_g"}, {"image", "-odd"}})).text.find("#SBATCH --image=-odd\n") !=
        std::string::npos);
}

TEST_CASE("a user profile overrides a built-in field by field, and says where each value came from") {
  UserSites sites({{"perlmutter", R"({"defaults": {"queue": "debug"}, "modules": ["pytorch/2.3"]})"},
                   {"mycluster", R"({"scheduler": "slurm", "gpus_per_node": 2, "login_host": "login.example.org"})"}});
  SiteProfile p = load_site("perlmutter");
  CHECK(p.defaults.at("queue") == "debug");
  CHECK(p.defaults.at("constraint") == "gpu");  // still the built-in's
  CHECK(p.modules == std::vector<std::string>{"pytorch/2.3"});
  CHECK(p.origin.at("defaults.queue") == (sites.dir / "ddl" / "sites" / "perlmutter.json").string());
  CHECK(p.origin.at("defaults.constraint") == "built-in");
  CHECK(p.origin.at("login_host") == "built-in");
  auto names = site_names();
  CHECK(std::find(names.begin(), names.end(), "mycluster") != names.end());
  CHECK(load_site("mycluster").gpus_per_node == 2);
}

TEST_CASE("a profile's hang_timeout gives the script's ddl run line --hang-timeout; a bad one names the field") {
  UserSites sites({{"perlmutter", R"({"hang_timeout": 1800})"}, {"neuron", R"({"hang_timeout": -5})"}});
  const std::string script = render_job_script(load_site("perlmutter"), job({{"nodes", "2"}, {"account", "m1234_g"}})).text;
  CHECK(script.find(" --launcher srun --gpu-order reverse --hang-timeout 1800 -- python3 train.py") != std::string::npos);
  CHECK_THROWS_WITH_AS(load_site("neuron"), doctest::Contains("field 'hang_timeout' must be a whole number from 0"), ddl::UsageError);
  UserSites without({});  // the built-in profile, which sets none
  CHECK(render_job_script(load_site("perlmutter"), job({{"nodes", "2"}, {"account", "m1234_g"}})).text.find("--hang-timeout") ==
        std::string::npos);
}

TEST_CASE("a broken profile names the file and the field") {
  UserSites sites({{"typo", R"({"scheduler": "slurm", "gpu_per_node": 4})"},
                   {"badtype", R"({"scheduler": "slurm", "gpus_per_node": "four"})"},
                   {"badjson", R"({"scheduler": )"},
                   {"badregex", R"({"scheduler": "slurm", "patterns": {"account": {"regex": "(["}}})"},
                   {"badoption", R"({"scheduler": "pbs", "defaults": {"walltime": "1:00:00"}})"},
                   {"unclosed", R"({"scheduler": "slurm", "gpu_request": "--gpus-per-node={{gpus_per_node"})"},
                   {"unknown", R"({"scheduler": "slurm", "directives": ["--x={{nosuch}}"]})"}});
  const std::string dir = (sites.dir / "ddl" / "sites").string();
  CHECK_THROWS_WITH_AS(load_site("typo"),
                       doctest::Contains(("site profile " + dir + "/typo.json: field 'gpu_per_node' is not a profile field").c_str()),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("badtype"), doctest::Contains("field 'gpus_per_node' must be a whole number"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("badjson"), doctest::Contains("badjson.json: not valid JSON"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("badregex"), doctest::Contains("field 'patterns.account.regex' is not a valid regular expression"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("badoption"), doctest::Contains("field 'defaults.walltime' names no option"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("unclosed"), doctest::Contains("field 'gpu_request' has '{{' without an option name and '}}' after it"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("unknown"), doctest::Contains("field 'directives[0]' names {{nosuch}}, which is no option"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("nosuchsite"), doctest::Contains("no site profile named 'nosuchsite' (known: alliance"), ddl::UsageError);
}

TEST_CASE("a misspelt key inside a profile's objects is refused, not ignored") {
  UserSites sites({{"partition", R"({"scheduler": "slurm", "partitions": {"gpu": {"gpus_per_node": 4, "cpus_per_node": 64}}})"},
                   {"container", R"({"scheduler": "slurm", "container": {"kind": "apptainer", "wrapper": ["apptainer exec"]}})"},
                   {"match", R"({"scheduler": "slurm", "match": {"host": "^login"}})"},
                   {"pattern", R"({"scheduler": "slurm", "patterns": {"account": {"regex": "^a", "hint": "x"}}})"},
                   {"fine", R"({"scheduler": "slurm", "partitions": {"gpu": {"gpus_per_node": 4, "cores_per_node": 64}},
                               "container": {"kind": "apptainer", "image_directive": "", "wrap": []},
                               "match": {"hostname": "^login", "environment": {"CLUSTER": "x"}},
                               "patterns": {"account": {"regex": "^a", "why": "w", "fix": "f"}}})"}});
  CHECK_THROWS_WITH_AS(
      load_site("partition"),
      doctest::Contains("field 'partitions.gpu.cpus_per_node' is not a partitions.gpu field (known: gpus_per_node, cores_per_node)"),
      ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("container"), doctest::Contains("field 'container.wrapper' is not a container field"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("match"), doctest::Contains("field 'match.host' is not a match field (known: hostname, environment)"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("pattern"), doctest::Contains("field 'patterns.account.hint' is not a patterns.account field"),
                       ddl::UsageError);
  CHECK_NOTHROW(load_site("fine"));
}

TEST_CASE("hostile profiles are usage errors naming the file and field, never a crash or a shell line") {
  std::string deep = R"({"scheduler": "slurm", "notes": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  UserSites sites({{"huge", R"({"scheduler": "slurm", "gpus_per_node": 4294967295})"},
                   {"inf", R"({"scheduler": "slurm", "cores_per_node": 1e999})"},
                   {"deep", deep},
                   {"inject", "{\"scheduler\": \"slurm\", \"directives\": [\"--exclusive\\nrm -rf ~\"]}"},
                   {"describe", "{\"scheduler\": \"slurm\", \"description\": \"a\\ntouch /tmp/pwned\"}"},
                   {"noted", "{\"scheduler\": \"slurm\", \"notes\": \"line one\\nline two\"}"},
                   {"badcount", R"({"scheduler": "slurm", "defaults": {"gpus_per_node": "four"}})"},
                   {"nonodes", R"({"scheduler": "slurm", "defaults": {"nodes": "0", "gpus_per_node": "0"}})"},
                   {"nocores", R"({"scheduler": "slurm", "defaults": {"cpus_per_task": "00"}})"}});
  CHECK_THROWS_WITH_AS(load_site("huge"), doctest::Contains("field 'gpus_per_node' must be a whole number from 0 to 1048576"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("inf"), doctest::Contains("inf.json: not valid JSON"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("deep"), doctest::Contains("deep.json: nested more than 64 levels deep"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("inject"), doctest::Contains("field 'directives[0]' contains a newline"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("describe"), doctest::Contains("field 'description' contains a newline"), ddl::UsageError);
  CHECK(load_site("noted").notes.find("line two") != std::string::npos);  // notes are printed, never scripted
  CHECK_THROWS_WITH_AS(load_site("badcount"), doctest::Contains("field 'defaults.gpus_per_node' is 'four'; it must be a whole number"),
                       ddl::UsageError);
  // A job of no nodes, or of tasks without a core, would wait in the queue only to fail.
  CHECK_THROWS_WITH_AS(load_site("nonodes"), doctest::Contains("field 'defaults.nodes' is '0'; it must be a whole number, at least 1"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("nocores"),
                       doctest::Contains("field 'defaults.cpus_per_task' is '00'; it must be a whole number, at least 1"), ddl::UsageError);
}

// libstdc++'s std::regex recurses once per character it matches and per level it parses: each of
// these would be a segfault.
TEST_CASE("profiles and values long enough to overflow std::regex are refused or unmatched, never a crash") {
  const std::string letters(100000, 'a');
  const std::string nested = std::string(300, '(') + "a" + std::string(300, ')');
  UserSites sites({{"longkey", R"({"scheduler": "slurm", "environment": {")" + letters + R"(": "1"}})"},
                   {"badkey", R"({"scheduler": "slurm", "environment": {"1)" + letters + R"(": "1"}})"},
                   {"longname", R"({"scheduler": "slurm", "gpu_request": "{{)" + letters + R"(}}"})"},
                   {"nested", R"({"scheduler": "slurm", "patterns": {"account": {"regex": ")" + nested + R"("}}})"},
                   {"matchnested", R"({"scheduler": "slurm", "match": {"environment": {"SITE": ")" + nested + R"("}}})"},
                   {"bysite", R"({"scheduler": "slurm", "match": {"environment": {"SITE": "[a-z]*"}}})"}});
  CHECK(load_site("longkey").environment.at(0).first == letters);
  CHECK_THROWS_WITH_AS(load_site("badkey"), doctest::Contains("is not a shell variable name"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("longname"), doctest::Contains("field 'gpu_request' names {{aaaa"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(
      load_site("nested"),
      doctest::Contains("field 'patterns.account.regex' is a regular expression of 601 characters; at most 512 are allowed"),
      ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("matchnested"), doctest::Contains("field 'match.environment.SITE' is a regular expression of 601"),
                       ddl::UsageError);
  const auto listed = list_sites();
  const auto matched = [&](const std::string& value) {
    const auto found = matching_sites(listed, "login01", {{"SITE", value}});
    return std::find(found.begin(), found.end(), "bysite") != found.end();
  };
  CHECK(matched("neuron"));
  CHECK_FALSE(matched(letters));  // longer than any site variable: matches nothing
  CHECK_FALSE(matched("Neuron"));
}

// Alliance's 12-16 cores per GPU were a pattern on -c, which refused a CPU job of 32 cores too.
TEST_CASE("the cores-per-GPU limit applies to GPU jobs only") {
  UserSites none({});
  CHECK_THROWS_WITH_AS(render_job_script(load_site("alliance"), job({{"account", "def-a"}, {"cpus_per_task", "32"}})),
                       doctest::Contains("-c/--cpus-per-task 32: site 'alliance' gives a GPU job at most 16 cores per GPU"),
                       ddl::UsageError);
  const std::string cpu_job =
      render_job_script(load_site("alliance"), job({{"account", "def-a"}, {"cpus_per_task", "32"}, {"gpus_per_node", "0"}})).text;
  CHECK(cpu_job.find("#SBATCH --cpus-per-task=32") != std::string::npos);
}

// Polaris' debug queue (the profile's default) takes 1-2 nodes for an hour: qsub refused -N 4.
TEST_CASE("a job outside its queue's nodes or walltime is refused naming the queues that take it") {
  UserSites sites({{"limited", R"({"scheduler": "slurm", "queues": {"short": {"max_nodes": 2, "max_time": "30"},
                                                                      "long": {"min_nodes": 2}}})"},
                   {"badqueues", R"({"scheduler": "slurm", "queues": {"q": {"min_nodes": 4, "max_nodes": 2}}})"},
                   {"badtime", R"({"scheduler": "slurm", "queues": {"q": {"max_time": "soon"}}})"}});
  const JobRequest polaris4 = job({{"nodes", "4"}, {"account", "P"}, {"filesystems", "home"}});
  CHECK_THROWS_WITH_AS(render_job_script(load_site("polaris"), polaris4),
                       doctest::Contains("queue debug takes 1 to 2 nodes for at most 01:00:00; this job asks for 4 nodes for 01:00:00"),
                       ddl::UsageError);
  try {
    render_job_script(load_site("polaris"), polaris4);
  } catch (const ddl::UsageError& e) {
    CHECK(e.hint() ==
          "use -q capacity or -q debug-scaling or -q preemptable (the queues that take 4 nodes for 01:00:00), or change -N or -t");
  }
  CHECK_NOTHROW(
      render_job_script(load_site("polaris"), job({{"nodes", "12"}, {"account", "P"}, {"filesystems", "home"}, {"queue", "prod"}})));
  CHECK_THROWS_WITH_AS(
      render_job_script(load_site("polaris"),
                        job({{"nodes", "12"}, {"account", "P"}, {"filesystems", "home"}, {"queue", "prod"}, {"time", "25:00:00"}})),
      doctest::Contains("queue prod takes 10 to 496 nodes for at most 24:00:00"), ddl::UsageError);
  // A Slurm time of 0 is no limit: more than any queue's longest.
  CHECK_THROWS_WITH_AS(render_job_script(load_site("limited"), job({{"queue", "short"}, {"time", "0"}})),
                       doctest::Contains("queue short takes 1 to 2 nodes for at most 30"), ddl::UsageError);
  CHECK_NOTHROW(render_job_script(load_site("limited"), job({{"queue", "short"}, {"time", "30"}})));
  CHECK_NOTHROW(render_job_script(load_site("limited"), job({{"queue", "other"}, {"nodes", "9"}})));  // no limits known
  CHECK_THROWS_WITH_AS(render_job_script(load_site("limited"), job({{"queue", "long"}})), doctest::Contains("takes 2 or more nodes"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("badqueues"), doctest::Contains("field 'queues.q.max_nodes' is 2, fewer than min_nodes 4"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("badtime"), doctest::Contains("field 'queues.q.max_time' is 'soon', not a time limit"), ddl::UsageError);
}

// libstdc++'s std::regex backtracks: (a|aa)*b on 44 a's took over a minute, 1024 would take for ever.
TEST_CASE("a site pattern that backtracks for ever is an error naming it, within seconds; a site match rule matches nothing") {
  const std::string slow = R"((a|aa)*b)";
  UserSites sites({{"slow", R"({"scheduler": "slurm", "patterns": {"account": {"regex": ")" + slow + R"("}}})"},
                   {"slowmatch", R"({"scheduler": "slurm", "match": {"environment": {"SITE": ")" + slow + R"("}}})"}});
  CHECK_THROWS_WITH_AS(render_job_script(load_site("slow"), job({{"account", std::string(200, 'a')}})),
                       doctest::Contains("site 'slow': patterns.account.regex took over 2 s to match -A/--account (200 characters)"),
                       ddl::UsageError);
  CHECK(render_job_script(load_site("slow"), job({{"account", "aaab"}})).text.find("--account=aaab") != std::string::npos);
  const auto found = matching_sites(list_sites(), "login01", {{"SITE", std::string(200, 'a')}});
  CHECK(std::find(found.begin(), found.end(), "slowmatch") == found.end());
  CHECK(ddl::match_whole_within("aab", slow, std::chrono::milliseconds(2000)) == ddl::RegexMatch::yes);
  CHECK(ddl::match_whole_within("aac", slow, std::chrono::milliseconds(2000)) == ddl::RegexMatch::no);
}

TEST_CASE("shell variable names are checked in linear time") {
  CHECK(ddl::is_variable_name("A"));
  CHECK(ddl::is_variable_name("_x1"));
  CHECK(ddl::is_variable_name(std::string(100000, 'Z')));
  CHECK_FALSE(ddl::is_variable_name(""));
  CHECK_FALSE(ddl::is_variable_name("1A"));
  CHECK_FALSE(ddl::is_variable_name("A-B"));
  CHECK_FALSE(ddl::is_variable_name("A B"));
  CHECK_FALSE(ddl::is_variable_name(std::string(100000, 'Z') + "."));
}

TEST_CASE("a profile path that is no regular file is a usage error naming it; the other sites still list") {
  UserSites sites({{"good", R"({"scheduler": "slurm", "jupyter": {"program": "notebook"}})"},
                   {"numbered", R"({"scheduler": "slurm", "jupyter": {"program": 5}})"},
                   {"emacs", R"({"scheduler": "slurm", "jupyter": {"program": "emacs"}})"}});
  const fs::path dir = sites.dir / "ddl" / "sites";
  fs::create_directories(dir / "adir.json");                  // a directory would fail in the stream: "a bug in ddl"
  REQUIRE(::mkfifo((dir / "fifo.json").c_str(), 0600) == 0);  // open() of a FIFO would block `ddl sites`
  fs::create_symlink("/dev/zero", dir / "zero.json");         // would never end
  fs::create_symlink("loop2.json", dir / "loop1.json");
  fs::create_symlink("loop1.json", dir / "loop2.json");
  CHECK_THROWS_WITH_AS(load_site("adir"), doctest::Contains("adir.json: is a directory, not a regular file"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("fifo"), doctest::Contains("fifo.json: is a FIFO, not a regular file"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("zero"), doctest::Contains("zero.json: is a device or socket"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("loop1"), doctest::Contains("loop1.json: cannot be read: Too many levels of symbolic links"),
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("numbered"), doctest::Contains("field 'jupyter.program' must be a string"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(load_site("emacs"), doctest::Contains("field 'jupyter.program' is 'emacs'; it must be one of lab, notebook, server"),
                       ddl::UsageError);
  const auto listed = list_sites();
  const auto good = std::find_if(listed.begin(), listed.end(), [](const ListedSite& l) { return l.name == "good"; });
  REQUIRE(good != listed.end());
  CHECK(good->profile.has_value());
  CHECK(std::count_if(listed.begin(), listed.end(), [](const ListedSite& l) { return !l.profile; }) == 7);
}

// 999999 GPUs x 999999 cores per task overflow an int (a case of tests/fuzz's fuzz_site_profile).
TEST_CASE("the largest counts a profile may default to multiply without overflow") {
  UserSites sites(
      std::map<std::string, std::string>{{"big", R"({"scheduler": "pbs", "defaults": {"gpus_per_node": 999999, "cpus_per_task": 999999},
                  "gpu_request": "select={{nodes}}:ncpus={{cpus_per_node}}:ngpus={{gpus_per_node}}"})"}});
  const std::string script = render_job_script(load_site("big"), job({})).text;
  CHECK(script.find("#PBS -l select=1:ncpus=999998000001:ngpus=999999\n") != std::string::npos);
}

TEST_CASE("a PBS time with an absurd day count is a usage error") {
  UserSites none({});
  CHECK_THROWS_WITH_AS(render_job_script(load_site("sockeye"), job({{"account", "st-a-1-gpu"}, {"time", "99999999999-1"}})),
                       doctest::Contains("-t/--time 99999999999-1: not a time limit"), ddl::UsageError);
}

TEST_CASE("shell quoting: plain words stay, anything else is single-quoted") {
  CHECK(shell_quote("train.py") == "train.py");
  CHECK(shell_quote("--lr=0.1") == "--lr=0.1");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("$(rm -rf /)") == "'$(rm -rf /)'");
}

TEST_CASE("shell quoting writes a carriage return as $'\\r', so the script has none and bash gives it back") {
  const std::string argument = "a\r\nb\r";
  const std::string quoted = shell_quote(argument);
  CHECK(quoted == "'a'$'\\r''\nb'$'\\r'''");
  CHECK(quoted.find('\r') == std::string::npos);
  // What bash makes of the word: printf's output, byte for byte (popen's sh hands bash the line).
  FILE* bash = ::popen(("bash -c " + shell_quote("printf %s " + quoted)).c_str(), "r");
  REQUIRE(bash != nullptr);
  std::string got;
  for (int c; (c = std::fgetc(bash)) != EOF;) got += static_cast<char>(c);
  CHECK(::pclose(bash) == 0);
  CHECK(got == argument);
}

TEST_CASE("ddl jupyter --env that starts with '-' is refused: source or conda activate would read it as an option") {
  CHECK_THROWS_WITH_AS(check_jupyter_environment("-n"), "--env -n: starts with '-', so conda activate would read it as an option",
                       ddl::UsageError);
  CHECK_THROWS_WITH_AS(check_jupyter_environment("--help/venv"), "--env --help/venv: starts with '-', so source would read it as an option",
                       ddl::UsageError);
  CHECK_NOTHROW(check_jupyter_environment(""));
  CHECK_NOTHROW(check_jupyter_environment("./-odd/venv"));
  CHECK_NOTHROW(check_jupyter_environment("pytorch-2.3"));
}

TEST_CASE("a site name is a plain file name: no path, no line break into the script's comment") {
  UserSites files({{"x\ntouch PWNED #", "{\"scheduler\": \"slurm\"}"}, {"ok-site_1.2", "{\"scheduler\": \"slurm\"}"}});
  for (const std::string& name :
       std::vector<std::string>{"x\ntouch PWNED #", "../slurm", "/etc/passwd", ".hidden", "", "a/b", std::string(200, 'a')})
    CHECK_THROWS_WITH_AS(load_site(name), doctest::Contains("a site name has letters, digits"), ddl::UsageError);
  CHECK(load_site("ok-site_1.2").name == "ok-site_1.2");
  CHECK(load_site("slurm").name == "slurm");
}

TEST_CASE("a bad value from a profile's defaults names the profile's field and file, not only the flag") {
  UserSites files(std::map<std::string, std::string>{
      {"late", R"({"scheduler": "slurm", "defaults": {"time": "soon"}})"},
      {"none", R"({"scheduler": "slurm", "defaults": {"cpus_per_task": "0"}})"},
      {"many",
       R"({"scheduler": "slurm", "gpus_per_node": 4, "gpu_request": "--gpus-per-node={{gpus_per_node}}", "defaults": {"gpus_per_node": "8"}})"}});
  const fs::path dir = fs::temp_directory_path() / "ddl_unit_user_sites" / "ddl" / "sites";
  CHECK_THROWS_WITH_AS(
      render_job_script(load_site("late"), job({})),
      doctest::Contains(("-t/--time (defaults.time in " + (dir / "late.json").string() + ") soon: not a time limit").c_str()),
      ddl::UsageError);
  CHECK_THROWS_WITH_AS(
      render_job_script(load_site("many"), job({})),
      doctest::Contains(("--gpus-per-node (defaults.gpus_per_node in " + (dir / "many.json").string() + ") 8: site 'many' has 4").c_str()),
      ddl::UsageError);
  // A count no job can have is refused as the profile is read.
  CHECK_THROWS_WITH_AS(
      load_site("none"),
      doctest::Contains(("site profile " + (dir / "none.json").string() + ": field 'defaults.cpus_per_task' is '0'").c_str()),
      ddl::UsageError);
  // A value the user typed is named by its flag alone.
  CHECK_THROWS_WITH_AS(render_job_script(load_site("late"), job({{"time", "later"}})), "-t/--time later: not a time limit",
                       ddl::UsageError);
}
