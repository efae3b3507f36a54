// Fuzz target `site_profile`: the site-profile loader (backends/site_profile) and batch-script
// rendering (backends/job_script) on a profile whose JSON text is the fuzz input.
//
// The input is written as a user profile ($XDG_CONFIG_HOME/ddl/sites/NAME.json, in a temporary
// directory of the harness) and loaded with load_site(NAME), the path `ddl submit --site` takes.
// NAME is the built-in site the input's "name" field names ("name": "perlmutter"), so that the
// input is laid over that built-in field by field, or else "fuzzsite", a site of the user's own. A
// profile that loads is then rendered into a Slurm and a PBS script (the profile as it is, and
// with the other scheduler), each for a job with no options and for one with the usual ones; a
// profile with `match` is also matched against a made-up machine (matching_sites).
//
// ddl::Error and ddl::UsageError are the loader's and renderer's answers to a bad profile or job;
// any other exception, a crash or a sanitizer report is a finding. Oracle: a rendered script holds
// no control character but newlines (a profile value must never start a line of its own).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "backends/builtin_sites.hpp"
#include "backends/job_script.hpp"
#include "backends/site_profile.hpp"
#include "common/error.hpp"

namespace fs = std::filesystem;
using namespace ddl::backends;

namespace {

fs::path g_sites;  // $XDG_CONFIG_HOME/ddl/sites

void remove_config_home() {
  std::error_code ec;
  fs::remove_all(g_sites.parent_path().parent_path(), ec);
}

void check_script(const std::string& text) {
  for (char c : text)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f) {
      std::fprintf(stderr, "fuzz_site_profile: a rendered script holds control character 0x%02x:\n%s\n", static_cast<unsigned char>(c),
                   text.c_str());
      std::abort();
    }
}

void render(const SiteProfile& site, const JobRequest& job) {
  try {
    check_script(render_job_script(site, job).text);
  } catch (const ddl::Error&) {}
}

// The built-in NAME when the text's first "name" field is "NAME" (the profile's own check wants
// them equal), else "fuzzsite".
std::string site_name(std::string_view text) {
  size_t at = text.find("\"name\"");
  if (at == std::string_view::npos) return "fuzzsite";
  at = text.find_first_not_of(" \t\r\n", at + 6);
  if (at == std::string_view::npos || text[at] != ':') return "fuzzsite";
  at = text.find_first_not_of(" \t\r\n", at + 1);
  if (at == std::string_view::npos) return "fuzzsite";
  for (const auto& site : builtin_sites())
    if (text.substr(at).starts_with("\"" + std::string(site.name) + "\"")) return std::string(site.name);
  return "fuzzsite";
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddl-fuzz-site-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {
    std::perror("fuzz_site_profile: mkdtemp");
    std::exit(1);
  }
  g_sites = fs::path(dir) / "ddl" / "sites";
  fs::create_directories(g_sites);
  ::setenv("XDG_CONFIG_HOME", dir.c_str(), 1);
  std::atexit(remove_config_home);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string name = site_name(text);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(g_sites, ec)) fs::remove(entry.path(), ec);
  {
    std::ofstream out(g_sites / (name + ".json"), std::ios::binary);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }

  SiteProfile site;
  try {
    site = load_site(name);
  } catch (const ddl::Error&) {
    return 0;
  }

  JobRequest plain;
  plain.command = {"python", "train.py", "--lr", "0.1"};
  plain.ddl_program = "/usr/bin/ddl";
  plain.ddl_version = "0.1.0";
  JobRequest usual = plain;
  usual.options = {{"nodes", "2"}, {"time", "1-02:03:04"}, {"account", "m1234_g"}, {"job_name", "fuzz run"}};
  usual.extra_directives = {"--mail-type=END"};
  usual.signal_before_seconds = 120;

  SiteProfile other = site;
  other.scheduler = site.scheduler == Scheduler::Slurm ? Scheduler::Pbs : Scheduler::Slurm;
  for (const SiteProfile* s : {&site, &other}) {
    render(*s, plain);
    render(*s, usual);
  }
  if (site.match) {
    try {
      (void)matching_sites(list_sites(), "nid001234.fuzz.example.org", {{"NERSC_HOST", "perlmutter"}, {"CC_CLUSTER", "narval"}});
    } catch (const ddl::Error&) {}
  }
  return 0;
}
