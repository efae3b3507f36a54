// Random secrets and names from the kernel (getrandom): store tokens, run ids, Jupyter tokens,
// shared-memory segment names.
#pragma once

#include <cstddef>
#include <string>

namespace ddl {

// `bytes` random bytes as lowercase hex; throws ddl::Error when the kernel cannot give them.
std::string random_hex(size_t bytes);

}  // namespace ddl
