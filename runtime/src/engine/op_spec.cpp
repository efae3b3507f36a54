#include "runtime/src/engine/op_spec.hpp"

#include <bit>
#include <stdexcept>

#include <fmt/format.h>

#include "rendezvous/store_protocol.hpp"
#include "runtime/src/engine/dtype.hpp"

namespace ddl::runtime {

const char* op_kind_name(OpKind kind) {
  static const char* names[] = {"allreduce",     "broadcast", "allgather", "allgatherv", "alltoall", "barrier",
                                "reducescatter", "alltoallv", "allgather", "join",       "alltoall"};
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

std::string Announcement::serialize() const {
  store::Writer w;
  w.u8(static_cast<uint8_t>((finalizing ? 1 : 0) | (joined ? 2 : 0) | (proposal.empty() ? 0 : 4)))
      .u32(static_cast<uint32_t>(submitted.size()));
  for (const auto& [name, spec] : submitted) {
    w.str(name).u8(static_cast<uint8_t>(spec.kind)).u8(static_cast<uint8_t>(spec.dtype)).u8(static_cast<uint8_t>(spec.reduce));
    w.u8(static_cast<uint8_t>((spec.cuda ? 1 : 0) | (spec.compress_fp16 ? 2 : 0) | (spec.ordered ? 4 : 0) | (spec.failure.empty() ? 0 : 8) |
                              (spec.call_site.empty() ? 0 : 16)));
    w.i64(spec.root).i64(static_cast<int64_t>(spec.count)).u32(static_cast<uint32_t>(spec.counts.size()));
    for (uint64_t c : spec.counts) w.i64(static_cast<int64_t>(c));
    w.u32(static_cast<uint32_t>(spec.shape.size()));
    for (int64_t d : spec.shape) w.i64(d);
    w.i64(std::bit_cast<int64_t>(spec.prescale)).i64(std::bit_cast<int64_t>(spec.postscale)).u32(spec.group_size);
    if (!spec.failure.empty()) w.str(spec.failure);
    if (!spec.call_site.empty()) w.str(spec.call_site);
  }
  w.u32(static_cast<uint32_t>(expired.size()));
  for (const auto& name : expired) w.str(name);
  w.u32(static_cast<uint32_t>(cached.size()));
  for (uint32_t id : cached) w.u32(id);
  if (!proposal.empty())
    for (uint64_t word : proposal.words) w.i64(static_cast<int64_t>(word));
  return w.take_frame();
}

Announcement Announcement::parse(const std::string& bytes) {
  auto fail = [] { return std::runtime_error("malformed negotiation message"); };
  auto length = store::peek_frame_length(bytes);
  if (!length || bytes.size() != 4 + *length) throw fail();
  store::Reader r(std::string_view(bytes).substr(4));
  Announcement a;
  auto flag = r.u8();
  auto n = r.u32();
  if (!flag || !n) throw fail();
  a.finalizing = (*flag & 1) != 0;
  a.joined = (*flag & 2) != 0;
  for (uint32_t i = 0; i < *n; ++i) {
    auto name = r.str();
    auto kind = r.u8();
    auto dtype = r.u8();
    auto reduce = r.u8();
    auto cuda = r.u8();
    auto root = r.i64();
    auto count = r.i64();
    auto ncounts = r.u32();
    if (!name || !kind || !dtype || !reduce || !cuda || !root || !count || !ncounts) throw fail();
    // A peer's bytes are not trusted: an unknown kind, dtype or reduction is a corrupt announcement.
    if (*kind > static_cast<uint8_t>(OpKind::AlltoallAny) || !valid_dtype(*dtype) || *reduce > DDL_PRODUCT) throw fail();
    OpSpec spec{static_cast<OpKind>(*kind),
                static_cast<ddl_dtype>(*dtype),
                static_cast<ddl_reduce_op>(*reduce),
                static_cast<int32_t>(*root),
                static_cast<uint64_t>(*count),
                {},
                (*cuda & 1) != 0,
                (*cuda & 2) != 0};
    for (uint32_t j = 0; j < *ncounts; ++j) {
      auto c = r.i64();
      if (!c) throw fail();
      spec.counts.push_back(static_cast<uint64_t>(*c));
    }
    auto ndim = r.u32();
    if (!ndim) throw fail();
    for (uint32_t j = 0; j < *ndim; ++j) {
      auto d = r.i64();
      if (!d) throw fail();
      spec.shape.push_back(*d);
    }
    auto prescale = r.i64();
    auto postscale = r.i64();
    auto group_size = r.u32();
    if (!prescale || !postscale || !group_size) throw fail();
    spec.prescale = std::bit_cast<double>(*prescale);
    spec.postscale = std::bit_cast<double>(*postscale);
    spec.group_size = *group_size;
    spec.ordered = (*cuda & 4) != 0;
    if (*cuda & 8) {
      auto failure = r.str();
      if (!failure || failure->empty()) throw fail();
      spec.failure = std::move(*failure);
    }
    if (*cuda & 16) {
      auto call_site = r.str();
      if (!call_site || call_site->empty()) throw fail();
      spec.call_site = std::move(*call_site);
    }
    a.submitted.emplace_back(std::move(*name), std::move(spec));
  }
  auto nexpired = r.u32();
  if (!nexpired) throw fail();
  for (uint32_t i = 0; i < *nexpired; ++i) {
    auto name = r.str();
    if (!name) throw fail();
    a.expired.push_back(std::move(*name));
  }
  auto ncached = r.u32();
  if (!ncached) throw fail();
  for (uint32_t i = 0; i < *ncached; ++i) {
    auto id = r.u32();
    if (!id) throw fail();
    a.cached.push_back(*id);
  }
  if (*flag & 4) {
    for (uint64_t& word : a.proposal.words) {
      auto v = r.i64();
      if (!v) throw fail();
      word = static_cast<uint64_t>(*v);
    }
    if (a.proposal.empty()) throw fail();
  }
  return a;
}

}  // namespace ddl::runtime
