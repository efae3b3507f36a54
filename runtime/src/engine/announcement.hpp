// What one rank tells the others in a negotiation round, and its bytes on the wire.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/src/core/op_spec.hpp"

namespace ddl::runtime {

// What one rank tells the others in one negotiation round.
struct Announcement {
  std::vector<std::pair<std::string, OpSpec>> submitted;  // ops newly submitted since the last round
  std::vector<uint32_t> cached;                           // more of them, as response-cache ids
  bool finalizing = false;                                // this rank called ddl_finalize
  bool joined = false;                                    // this rank waits in ddl_join
  std::vector<std::string> expired;                       // rank 0 only: ops that waited too long
  Proposal proposal;                                      // the one op above, offered to run in this round (then nothing else is announced)

  std::string serialize() const;
  static Announcement parse(const std::string& bytes);  // throws std::runtime_error when malformed
};

}  // namespace ddl::runtime
