// Element types and reductions of libddl, on host memory.
#pragma once

#include <cstddef>
#include <string>

#include "ddl/ddl.h"

namespace ddl::runtime {

bool valid_dtype(int dtype);
// Whether reductions take `dtype` (DDL_BOOL and the unsigned 16-64 bit types are moved only).
bool reducible_dtype(ddl_dtype dtype);
bool valid_reduce_op(int op);
size_t dtype_size(ddl_dtype dtype);
const char* dtype_name(ddl_dtype dtype);
const char* reduce_op_name(ddl_reduce_op op);

// out[i] = a[i] op b[i] for n elements (out may alias a or b). AVERAGE reduces as SUM; see
// divide_by_world_size. The signature is the one Gloo's reduce functions have.
using ReduceFunction = void (*)(void* out, const void* a, const void* b, size_t n);
ReduceFunction reduce_function(ddl_dtype dtype, ddl_reduce_op op);

// data[i] = the identity of `op` (x op identity == x): 0 for SUM and AVERAGE, 1 for PRODUCT, the
// largest value (+inf for floats) for MIN, the lowest (-inf) for MAX. What a rank that has joined
// contributes to a reduction.
void fill_identity(void* data, size_t n, ddl_dtype dtype, ddl_reduce_op op);

// data[i] /= divisor, for the AVERAGE reduction (integers truncate toward zero).
void divide_by_world_size(void* data, size_t n, ddl_dtype dtype, int divisor);

// data[i] *= factor, as Horovod's prescale and postscale do it: 16-bit floats in float, float32 in
// float, integers in double truncated toward zero. A factor of 1 leaves data untouched.
void scale(void* data, size_t n, ddl_dtype dtype, double factor);

// IEEE half and bfloat16 <-> float, round to nearest even.
float half_to_float(unsigned short h);
unsigned short float_to_half(float f);
float bfloat16_to_float(unsigned short b);
unsigned short float_to_bfloat16(float f);

}  // namespace ddl::runtime
