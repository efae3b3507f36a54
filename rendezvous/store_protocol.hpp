// Wire format of the rendezvous store, shared by the server (launcher/store_server) and the client
// (rendezvous/tcp_store_client).
//
// Every message is a frame: a 4-byte little-endian body length, then the body. A request body is
// one opcode byte followed by its fields; a response body is one status byte followed by its
// fields. Strings are a 4-byte little-endian length and the bytes; integers are 8-byte little-endian.
// The first request of every connection must be Auth with the run's token; the server answers a
// right token with Ok and a wrong one by closing the connection without writing anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddl::store {

enum class Op : uint8_t {
  Auth = 1,    // token
  Set = 2,     // key, value
  Get = 3,     // key                      -> Ok value | NotFound
  Add = 4,     // key, i64 delta           -> Ok i64 new value
  Wait = 5,    // u32 count, keys, i64 ms  -> Ok | Timeout
  Delete = 6,  // key                      -> Ok i64 (1 deleted, 0 absent)
};

enum class Status : uint8_t { Ok = 0, NotFound = 1, Timeout = 2, Error = 3 };

// Frames larger than this are a protocol error; rendezvous values are small (ids, addresses).
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
// Before authentication a peer may send only this much: a stranger cannot make the server buffer.
inline constexpr uint32_t kMaxAuthFrameBytes = 4096;

// Builds a frame body field by field.
class Writer {
 public:
  Writer() { frame_.reserve(128); }  // one allocation for a small frame, not one per doubling
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& str(std::string_view s);
  // The finished frame: length prefix followed by the body.
  std::string frame() const;
  // The same without a copy; the writer starts afresh.
  std::string take_frame();

 private:
  std::string frame_ = std::string(4, '\0');  // the length prefix, patched by frame(), then the body
};

// Reads fields from a frame body; every accessor returns nullopt when the body is too short.
class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}
  std::optional<uint8_t> u8();
  std::optional<uint32_t> u32();
  std::optional<int64_t> i64();
  std::optional<std::string> str();
  bool at_end() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

// Decodes the length prefix at the start of buf, if 4 bytes are there.
std::optional<uint32_t> peek_frame_length(std::string_view buf);

// Compares two secrets in time that depends only on their lengths, not on where they differ.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace ddl::store
