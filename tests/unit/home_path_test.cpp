#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/home_path.hpp"
#include "doctest/doctest.h"

using ddl::with_home_expanded;

namespace {

// Sets HOME for one test case and puts back what was there.
class HomeFolder {
 public:
  explicit HomeFolder(const char* home) {
    if (const char* before = std::getenv("HOME")) before_ = before;
    had_ = std::getenv("HOME") != nullptr;
    if (home != nullptr)
      ::setenv("HOME", home, 1);
    else
      ::unsetenv("HOME");
  }
  ~HomeFolder() {
    if (had_)
      ::setenv("HOME", before_.c_str(), 1);
    else
      ::unsetenv("HOME");
  }
  HomeFolder(const HomeFolder&) = delete;
  HomeFolder& operator=(const HomeFolder&) = delete;

 private:
  std::string before_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("a leading ~ is the home folder, as the shell makes it (--output-dir=~/runs, where the shell leaves it)") {
  HomeFolder home("/home/someone");
  CHECK(with_home_expanded("~/runs") == "/home/someone/runs");
  CHECK(with_home_expanded("~") == "/home/someone");
  CHECK(with_home_expanded("~/") == "/home/someone/");
  CHECK(with_home_expanded("/opt/venv") == "/opt/venv");
  CHECK(with_home_expanded("./~/odd") == "./~/odd");  // only a leading ~ is a home
  CHECK(with_home_expanded("runs~") == "runs~");
  CHECK(with_home_expanded("") == "");
}

TEST_CASE("~name is that user's home; a name no user has is left as written, as the shell leaves it") {
  HomeFolder home("/home/someone");
  const passwd* root = ::getpwuid(0);
  REQUIRE(root != nullptr);
  const std::string root_home = root->pw_dir;
  CHECK(with_home_expanded("~" + std::string(root->pw_name) + "/x") == root_home + "/x");
  CHECK(with_home_expanded("~" + std::string(root->pw_name)) == root_home);
  CHECK(with_home_expanded("~no-such-user-ddl/x") == "~no-such-user-ddl/x");
}

TEST_CASE("without HOME, ~ is this user's home from the password database") {
  HomeFolder home(nullptr);
  const passwd* me = ::getpwuid(::getuid());
  REQUIRE(me != nullptr);
  CHECK(with_home_expanded("~/x") == std::string(me->pw_dir) + "/x");
}
