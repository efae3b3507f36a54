// Fuzz target `negotiation`: the engine's negotiation messages (Announcement::parse, the decoder of
// what every rank allgathers each round, runtime/src/engine/announcement.cpp) and the Negotiator
// (runtime/src/engine/negotiator.cpp) that merges the decoded rounds.
//
//   byte 0   world size: 1 + (byte & 3)
//   rest     negotiation messages as on the wire, one after another: each is a frame (4-byte
//            little-endian length, then that many bytes; the last may be cut short). Every `size`
//            messages that decode make one round, merged in rank order.
//
// A message that does not decode must throw std::runtime_error ("malformed negotiation message");
// the engine turns that into an error on every op. merge() may throw std::runtime_error for a cache
// id no op was given; the engine stops there, so this input does too. Any other exception, a crash
// or a sanitizer report is a finding. Oracle: a decoded message encodes to bytes that decode to the
// same message (serialize(parse(serialize(a))) == serialize(a)).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "rendezvous/store_protocol.hpp"
#include "runtime/src/engine/announcement.hpp"
#include "runtime/src/engine/negotiator.hpp"

using namespace ddl::runtime;

namespace {

// Only the plain std::runtime_error that parse() and merge() throw on purpose is expected.
bool expected(const std::exception& e) { return typeid(e) == typeid(std::runtime_error); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int world = 1 + (data[0] & 3);
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  Negotiator negotiator(world, /*cache_capacity=*/8);
  std::vector<Announcement> round;
  auto now = std::chrono::steady_clock::time_point{};
  size_t at = 0;
  while (at < rest.size()) {
    auto length = ddl::store::peek_frame_length(std::string_view(rest).substr(at));
    const size_t take = length ? std::min<size_t>(rest.size() - at, 4 + static_cast<size_t>(*length)) : rest.size() - at;
    const std::string message = rest.substr(at, take);
    at += take;

    Announcement a;
    try {
      a = Announcement::parse(message);
    } catch (const std::exception& e) {
      if (!expected(e)) throw;
      continue;  // the engine fails every op on a malformed message; the next one is looked at anyway
    }
    const std::string once = a.serialize();
    const std::string twice = Announcement::parse(once).serialize();
    if (once != twice) {
      std::fprintf(stderr, "fuzz_negotiation: a decoded message does not survive encoding (%zu vs %zu bytes)\n", once.size(), twice.size());
      std::abort();
    }

    round.push_back(std::move(a));
    if (static_cast<int>(round.size()) < world) continue;
    RoundDecision decision;
    try {
      decision = negotiator.merge(round, now);
    } catch (const std::exception& e) {
      if (!expected(e)) throw;
      return 0;  // an unknown cache id: the engine stops negotiating
    }
    round.clear();
    for (const auto& op : decision.ready) (void)op.spec().describe();
    now += std::chrono::seconds(1);
    (void)negotiator.stalled(now, std::chrono::milliseconds(1500));
    (void)negotiator.pending_names();
  }
  return 0;
}
