#include "runtime/src/engine/progress_mark.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ddl::runtime {

ProgressMark::ProgressMark(const std::string& path) {
  if (!path.empty()) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
}

ProgressMark::~ProgressMark() {
  if (fd_ >= 0) ::close(fd_);
}

void ProgressMark::touch() const { ::futimens(fd_, nullptr); }

}  // namespace ddl::runtime
