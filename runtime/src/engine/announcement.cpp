#include "runtime/src/engine/announcement.hpp"

#include <bit>
#include <stdexcept>

#include "rendezvous/store_protocol.hpp"
#include "runtime/src/core/dtype.hpp"

namespace ddl::runtime {

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
    if (*kind > static_cast<uint8_t>(kLastOpKind) || !valid_dtype(*dtype) || *reduce > DDL_PRODUCT) throw fail();
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
