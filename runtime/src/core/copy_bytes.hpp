// The copy on libddl's hot paths: into and out of the fusion buffer and the shared-memory slots.
#pragma once

#include <cstddef>

namespace ddl::runtime {

// memcpy(to, from, bytes), for buffers that do not overlap, without glibc's `rep movsb` range.
// glibc 2.36 copies blocks from about 2 KiB up to a cache-size threshold with `rep movsb`, which on
// the AMD EPYC (Zen 3) machine of bench/copy_bench.cpp runs ~15x slower than plain vector moves
// (docs/benchmarks.md). Fusion copies blocks that size, one gradient at a time, and the
// shared-memory collectives copy chunks in and out of their slots.
void copy_bytes(void* to, const void* from, size_t bytes);

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (empty ranges share none).
bool bytes_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes);

// memmove(to, from, bytes): copy_bytes unless the two ranges overlap.
void move_bytes(void* to, const void* from, size_t bytes);

}  // namespace ddl::runtime
