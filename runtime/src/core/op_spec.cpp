#include "runtime/src/core/op_spec.hpp"

#include <bit>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/src/core/dtype.hpp"

namespace ddl::runtime {

const char* op_kind_name(OpKind kind) {
  static const char* names[] = {"allreduce",     "broadcast", "allgather", "allgatherv", "alltoall", "barrier",
                                "reducescatter", "alltoallv", "allgather", "join",       "alltoall"};
  static_assert(std::size(names) == static_cast<size_t>(kLastOpKind) + 1, "op_kind_name must name every OpKind");
  auto i = static_cast<size_t>(kind);
  return i < std::size(names) ? names[i] : "unknown-op";
}

std::string OpSpec::describe() const {
  if (kind == OpKind::Barrier || kind == OpKind::Join) return op_kind_name(kind);
  if (kind == OpKind::AllgatherAny || kind == OpKind::AlltoallAny) {
    // Each rank's row count is its own: ranks agree on the type and the shape of one row.
    std::string s = shape.empty()
                        ? fmt::format("{} of {} elements", op_kind_name(kind), dtype_name(dtype))
                        : fmt::format("{} of {} rows of shape ({})", op_kind_name(kind), dtype_name(dtype), fmt::join(shape, ","));
    if (group_size > 0) s += fmt::format(" (one of a group of {})", group_size);
    if (!call_site.empty()) s += fmt::format(" called at {}", call_site);
    return s;
  }
  std::string s = fmt::format("{} {}[{}]", op_kind_name(kind), dtype_name(dtype), count);
  if (!shape.empty()) s += fmt::format(" shape ({})", fmt::join(shape, ","));
  if (kind == OpKind::Allreduce || kind == OpKind::Reducescatter) s += fmt::format(" {}", reduce_op_name(reduce));
  if (kind == OpKind::Broadcast) s += fmt::format(" from rank {}", root);
  if (kind == OpKind::Allgatherv || kind == OpKind::Reducescatter) s += fmt::format(" counts [{}]", fmt::join(counts, ","));
  if (prescale != 1.0) s += fmt::format(" prescaled by {}", prescale);
  if (postscale != 1.0) s += fmt::format(" postscaled by {}", postscale);
  s += cuda ? " on cuda" : "";
  s += compress_fp16 ? " compressed to float16" : "";
  if (group_size > 0) s += fmt::format(" (one of a group of {})", group_size);
  if (!call_site.empty()) s += fmt::format(" called at {}", call_site);
  return s;
}

namespace {

uint64_t first_proposal_word(const OpSpec& spec) {
  return 1 | uint64_t{static_cast<uint8_t>(spec.kind)} << 8 | uint64_t{static_cast<uint8_t>(spec.dtype)} << 16 |
         uint64_t{static_cast<uint8_t>(spec.reduce)} << 24 | uint64_t{static_cast<uint32_t>(spec.root)} << 32;
}

// A digest of what the proposal's other words leave out, so that unnamed ops whose shapes or
// scales differ between ranks do not agree (they go through negotiation and its mismatch error).
// FNV-1a's step on whole 64-bit words, each scrambled first (splitmix64's finalizer) so that every
// bit of a word reaches every bit of the digest.
uint64_t digest_of_rest(const OpSpec& spec) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](uint64_t v) {
    v ^= v >> 30;
    v *= 0xbf58476d1ce4e5b9ull;
    v ^= v >> 27;
    v *= 0x94d049bb133111ebull;
    v ^= v >> 31;
    h = (h ^ v) * 1099511628211ull;
  };
  mix(spec.shape.size());
  for (int64_t d : spec.shape) mix(static_cast<uint64_t>(d));
  mix(spec.counts.size());
  for (uint64_t c : spec.counts) mix(c);
  mix(std::bit_cast<uint64_t>(spec.prescale));
  mix(std::bit_cast<uint64_t>(spec.postscale));
  mix((spec.cuda ? 1 : 0) | (spec.compress_fp16 ? 2 : 0) | (spec.ordered ? 4 : 0));
  mix(spec.group_size);
  for (char c : spec.call_site) mix(static_cast<unsigned char>(c));
  return h;
}

}  // namespace

Proposal Proposal::for_cached(const OpSpec& spec, uint32_t cache_id) { return {{first_proposal_word(spec), spec.count, cache_id, 0}}; }

Proposal Proposal::for_unnamed(const OpSpec& spec, uint64_t unnamed_index) {
  return {{first_proposal_word(spec), spec.count, unnamed_index | (uint64_t{1} << 63), digest_of_rest(spec)}};
}

}  // namespace ddl::runtime
