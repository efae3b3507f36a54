#include <doctest/doctest.h>

#include <sstream>

#include "backends/command.hpp"
#include "backends/jobs.hpp"
#include "backends/slurm/slurm_jobs.hpp"
#include "common/error.hpp"

using ddl::backends::looks_like_job_id;
using ddl::backends::scheduler_unreachable;

// OpenPBS writes a value of digits alone unquoted (openpbs#1255): after `ddl submit -J 42`, a reader
// that takes only text there would stop `ddl status` with a JSON type error ("this is a bug").
TEST_CASE("qstat's JSON: numbers where text was expected, entries that are no objects, exit codes of every range") {
  const auto jobs = ddl::backends::pbs_jobs_from_qstat_json(R"({"Jobs": {
    "12.pbs": {"Job_Name": 42, "job_state": "F", "Output_Path": "login1:/home/a/42.o12", "Exit_status": 271},
    "13.pbs": {"Job_Name": "b", "job_state": "F", "Exit_status": 99999999999},
    "14.pbs": {"Job_Name": ["odd"], "job_state": "F", "Exit_status": -3},
    "15.pbs": {"Job_Name": "d", "job_state": "F", "Exit_status": 256},
    "16.pbs": "not an object",
    "17.pbs": {"Job_Name": "e", "job_state": "R", "Exit_status": "7"}}})");
  REQUIRE(jobs.size() == 5);
  CHECK(jobs[0].id == "12.pbs");
  CHECK(jobs[0].name == "42");
  CHECK(jobs[0].output == "/home/a/42.o12");
  CHECK(jobs[0].finished);
  CHECK(jobs[0].exit_code == 143);  // 256 + SIGTERM
  CHECK(jobs[1].exit_code == 1);    // past int's range: no code, a failure
  CHECK(jobs[2].name == "");
  CHECK(jobs[2].exit_code == 1);  // PBS could not start it
  CHECK(jobs[3].exit_code == 1);  // 256 would read as 0, a success
  CHECK(jobs[4].id == "17.pbs");
  CHECK(jobs[4].exit_code == 1);
  CHECK_FALSE(jobs[4].finished);
  // Unreadable is an error, not an empty queue (a quote OpenPBS left unescaped in a job variable).
  for (const char* not_qstat :
       {"", "[]", "5", R"({"Jobs": []})", R"({"Jobs": 5})", "{\"Jobs\": {", R"({"Jobs": {"1.pbs": {"v": "it\'s"}}})"})
    CHECK_THROWS_AS(ddl::backends::pbs_jobs_from_qstat_json(not_qstat), ddl::Error);
  CHECK(ddl::backends::pbs_jobs_from_qstat_json(R"({"timestamp": 1, "pbs_server": "pbs01"})").empty());  // no job at all
}

// std::regex recurses once per character it matches: `ddl cancel` of 100,000 digits would be a segfault.
TEST_CASE("a job id of 100,000 digits is no job id, not a crash") {
  CHECK(looks_like_job_id("4242"));
  CHECK(looks_like_job_id("4242.pbs01"));
  CHECK(looks_like_job_id("17_3"));
  CHECK_FALSE(looks_like_job_id(std::string(100000, '1')));
  CHECK_FALSE(looks_like_job_id("4242;rm"));
  CHECK(ddl::backends::not_a_job_id("x;y") == "'x;y' is not a job id");
  CHECK(ddl::backends::not_a_job_id(std::string(100000, '1')) == "'" + std::string(64, '1') + "...' (100000 characters) is not a job id");
}

// submit_job tells a submit that timed out (the job may be queued) from a refusal by this flag.
TEST_CASE("a command stopped at its timeout says so, apart from one that failed") {
  const auto slow = ddl::backends::run_command({"sleep", "5"}, std::chrono::milliseconds(200));
  CHECK(slow.timed_out);
  CHECK(slow.exit_code == -1);
  const auto failed = ddl::backends::run_command({"false"});
  CHECK_FALSE(failed.timed_out);
  CHECK(failed.exit_code == 1);
}

TEST_CASE("sbatch and qsub saying they reached no scheduler is told apart from a refusal") {
  CHECK(scheduler_unreachable("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n"));
  CHECK(scheduler_unreachable("qsub: cannot connect to server pbs01 (errno=111) Connection refused\n"));
  CHECK_FALSE(
      scheduler_unreachable("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"));
  CHECK_FALSE(scheduler_unreachable("qsub: Unknown queue"));
  CHECK_FALSE(scheduler_unreachable(""));
}

using namespace ddl::backends::slurm;

namespace {

JobFacts plain_job() { return {"12", "COMPLETED", "None", "vm", "0", "alice", "nid001", "12", "N/A"}; }

}  // namespace

TEST_CASE("squeue's fixed fields are read by position; free text never shares their line") {
  auto facts = read_facts("31|PENDING|JobHeldUser||0|alice|n/a|31|N/A|\n");
  REQUIRE(facts);
  CHECK(facts->job_id == "31");
  CHECK(facts->state == "PENDING");
  CHECK(facts->reason == "JobHeldUser");
  CHECK(facts->nodes == "");
  CHECK(facts->array_task_id == "N/A");
  // The first record of an array's several.
  facts = read_facts("26|COMPLETED|None|vm|0|root|vm|26|5|\n28|COMPLETED|None|vm|0|root|vm|26|4|\n");
  REQUIRE(facts);
  CHECK(facts->array_task_id == "5");
  CHECK_FALSE(read_facts(""));
  CHECK_FALSE(read_facts("slurm_load_jobs error: Invalid job id specified\n"));
  // The query names no free-text field, so nothing a user sets can reach this line.
  std::istringstream fields(facts_query("31").back());
  for (std::string field; std::getline(fields, field, ',');)
    for (const char* free_text : {"Name:", "STDOUT:", "STDERR:", "Comment:", "WorkDir:", "Command:", "Account:"})
      CHECK_FALSE(field.starts_with(free_text));
}

TEST_CASE("a free-text field is asked for alone and read whole: blanks, Key= text, '|' and newlines") {
  const auto query = one_field_query(plain_job(), "STDOUT");
  REQUIRE(query);
  CHECK(*query == std::vector<std::string>{"squeue", "-h", "-t", "all", "-j", "12", "-O", "STDOUT:0"});
  CHECK(read_one_field("/tmp/x/my out.txt\n") == "/tmp/x/my out.txt");
  CHECK(read_one_field("x JobState=COMPLETED ExitCode=7:0 StdOut=/etc/hostname\n") ==
        "x JobState=COMPLETED ExitCode=7:0 StdOut=/etc/hostname");
  CHECK(read_one_field("a|b\nc\n\n") == "a|b\nc\n");
  JobFacts task = plain_job();
  task.job_id = "28";
  task.array_job_id = "26";
  task.array_task_id = "4";
  CHECK(one_field_query(task, "Name")->at(5) == "26_4");  // 28 alone would select every task of 26
  task.array_task_id = "3-5";                             // tasks not yet started: one record, several files
  CHECK_FALSE(one_field_query(task, "STDOUT"));
}

TEST_CASE("Slurm's exit codes: 22.05's raw wait status and later versions' code:signal") {
  CHECK(exit_status("0") == 0);
  CHECK(exit_status("1792") == 7);  // 7 << 8
  CHECK(exit_status("15") == 128 + 15);
  CHECK(exit_status("7:0") == 7);
  CHECK(exit_status("0:9") == 128 + 9);
  CHECK_FALSE(exit_status(""));
  CHECK_FALSE(exit_status("4294967294"));  // NO_VAL
  CHECK_FALSE(exit_status("x JobState"));
}

TEST_CASE("the output file is the one slurmstepd writes for the batch step") {
  const JobFacts job = plain_job();
  CHECK(batch_output_file("/home/a/ddl-%j.out", job, "") == "/home/a/ddl-12.out");
  CHECK(batch_output_file("/tmp/x/my out.txt", job, "") == "/tmp/x/my out.txt");
  CHECK(batch_output_file("/o/%x-%u-%N-%5j-%s-%t-%n-%J-%%j-%q-%", job, "n m") == "/o/n m-alice-nid001-00012-batch-0-0-12-%j-%q-%");
  CHECK(batch_output_file("/o/%a-%A", job, "") == "/o/4294967294-12");  // not an array: Slurm's NO_VAL
  JobFacts task = job;
  task.job_id = "28";
  task.array_job_id = "26";
  task.array_task_id = "4";
  CHECK(batch_output_file("/o/arr-%A-%a-%3a-%j", task, "") == "/o/arr-26-4-004-28");
  // A backslash turns the patterns off; each lone one is dropped, each pair kept as one.
  CHECK(batch_output_file("/tmp/x/dir-a\\b-%j.out", job, "") == "/tmp/x/dir-ab-%j.out");
  CHECK(batch_output_file("/tmp/x/a\\\\b", job, "") == "/tmp/x/a\\b");
  CHECK(pattern_names_job("/o/%x.out"));
  CHECK(pattern_names_job("/o/%8x.out"));
  CHECK_FALSE(pattern_names_job("/o/%%x.out"));
  CHECK_FALSE(pattern_names_job("/o/\\%x.out"));
  CHECK_FALSE(pattern_names_job("/o/ddl-%j.out"));
}

TEST_CASE("an ended job's exit code: a job that never completed is a failure though Slurm says 0:0") {
  using ddl::backends::ended_job_exit_code;
  using ddl::backends::JobState;
  auto ended = [](const char* state, std::optional<int> code) {
    JobState s;
    s.state = state;
    s.exit_code = code;
    s.finished = true;
    return s;
  };
  CHECK(ended_job_exit_code(ended("COMPLETED", 0)) == 0);
  CHECK(ended_job_exit_code(ended("FAILED", 3)) == 3);
  CHECK(ended_job_exit_code(ended("CANCELLED", 0)) == 1);  // cancelled while pending
  CHECK(ended_job_exit_code(ended("NODE_FAIL", 0)) == 1);
  CHECK(ended_job_exit_code(ended("TIMEOUT", 0)) == 1);
  CHECK(ended_job_exit_code(ended("COMPLETED", std::nullopt)) == 1);  // its end unknown
  CHECK(ended_job_exit_code(ended("F", 0)) == 0);                     // PBS: finished
  CHECK(ended_job_exit_code(ended("F", 271)) == 271);                 // PBS: killed (qdel)
}
