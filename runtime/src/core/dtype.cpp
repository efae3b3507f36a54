#include "runtime/src/core/dtype.hpp"

#include <math.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace ddl::runtime {

bool valid_dtype(int dtype) { return dtype >= DDL_FLOAT16 && dtype <= DDL_UINT64; }
bool reducible_dtype(ddl_dtype dtype) { return dtype >= DDL_FLOAT16 && dtype <= DDL_INT16; }
bool valid_reduce_op(int op) { return op >= DDL_SUM && op <= DDL_PRODUCT; }

size_t dtype_size(ddl_dtype dtype) {
  switch (dtype) {
    case DDL_UINT8:
    case DDL_INT8:
    case DDL_BOOL: return 1;
    case DDL_FLOAT16:
    case DDL_BFLOAT16:
    case DDL_INT16:
    case DDL_UINT16: return 2;
    case DDL_FLOAT32:
    case DDL_INT32:
    case DDL_UINT32: return 4;
    case DDL_FLOAT64:
    case DDL_INT64:
    case DDL_UINT64: return 8;
  }
  return 0;
}

const char* dtype_name(ddl_dtype dtype) {
  static const char* names[] = {"float16", "bfloat16", "float32", "float64", "int32",  "int64", "uint8",
                                "int8",    "int16",    "bool",    "uint16",  "uint32", "uint64"};
  return valid_dtype(dtype) ? names[dtype] : "unknown-dtype";
}

const char* reduce_op_name(ddl_reduce_op op) {
  static const char* names[] = {"sum", "average", "min", "max", "product"};
  return valid_reduce_op(op) ? names[op] : "unknown-op";
}

float half_to_float(unsigned short h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal half: normalize it
    int shift = 0;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ff;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  float f = NAN;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

unsigned short float_to_half(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const uint32_t abs = bits & 0x7fffffff;
  if (abs > 0x7f800000) return static_cast<unsigned short>(sign | 0x7e00);   // NaN
  if (abs >= 0x47800000) return static_cast<unsigned short>(sign | 0x7c00);  // >= 65536: inf
  if (abs < 0x33000000) return static_cast<unsigned short>(sign);            // < 2^-25: zero
  const int exponent = static_cast<int>(abs >> 23);
  uint32_t result = 0;
  uint32_t rest = 0;
  uint32_t half_way = 0;
  if (exponent < 113) {  // a half subnormal: count units of 2^-24
    const int shift = 126 - exponent;
    const uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
    result = mantissa >> shift;
    rest = mantissa & ((1u << shift) - 1);
    half_way = 1u << (shift - 1);
  } else {  // a normal half: rebias the exponent, keep 10 mantissa bits
    result = (static_cast<uint32_t>(exponent - 112) << 10) | ((abs >> 13) & 0x3ff);
    rest = abs & 0x1fff;
    half_way = 0x1000;
  }
  // Round to nearest even; a carry out of the mantissa correctly bumps the exponent (up to inf).
  if (rest > half_way || (rest == half_way && (result & 1))) ++result;
  return static_cast<unsigned short>(sign | result);
}

float bfloat16_to_float(unsigned short b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f = NAN;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

unsigned short float_to_bfloat16(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<unsigned short>((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<unsigned short>((bits + rounding) >> 16);
}

namespace {

template <typename T, typename Op>
void apply(void* out, const void* a, const void* b, size_t n, Op op) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
}

// 16-bit floats reduce in float and round back once per pair.
template <float (*ToFloat)(unsigned short), unsigned short (*FromFloat)(float), typename Op>
void apply_16(void* out, const void* a, const void* b, size_t n, Op op) {
  auto* o = static_cast<unsigned short*>(out);
  const auto* x = static_cast<const unsigned short*>(a);
  const auto* y = static_cast<const unsigned short*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = FromFloat(op(ToFloat(x[i]), ToFloat(y[i])));
}

struct Sum {
  template <typename T>
  T operator()(T x, T y) const {
    return x + y;
  }
};
struct Product {
  template <typename T>
  T operator()(T x, T y) const {
    return x * y;
  }
};
// A NaN on any rank makes the result NaN, as torch.min/max and MPI give: std::min and std::max
// return their first operand when either is NaN, so the result would depend on which rank held it
// (allreduce(loss, op=Max) then missed a NaN loss on every rank but the first).
template <typename T>
bool either_nan(T x, T y, T& nan) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(x)) return nan = x, true;
    if (std::isnan(y)) return nan = y, true;
  }
  return false;
}
struct Min {
  template <typename T>
  T operator()(T x, T y) const {
    T nan;
    return either_nan(x, y, nan) ? nan : std::min(x, y);
  }
};
struct Max {
  template <typename T>
  T operator()(T x, T y) const {
    T nan;
    return either_nan(x, y, nan) ? nan : std::max(x, y);
  }
};

template <typename Op>
ReduceFunction for_dtype(ddl_dtype dtype) {
  switch (dtype) {
    case DDL_FLOAT16:
      return [](void* o, const void* a, const void* b, size_t n) { apply_16<half_to_float, float_to_half>(o, a, b, n, Op{}); };
    case DDL_BFLOAT16:
      return [](void* o, const void* a, const void* b, size_t n) { apply_16<bfloat16_to_float, float_to_bfloat16>(o, a, b, n, Op{}); };
    case DDL_FLOAT32: return [](void* o, const void* a, const void* b, size_t n) { apply<float>(o, a, b, n, Op{}); };
    case DDL_FLOAT64: return [](void* o, const void* a, const void* b, size_t n) { apply<double>(o, a, b, n, Op{}); };
    case DDL_INT32: return [](void* o, const void* a, const void* b, size_t n) { apply<int32_t>(o, a, b, n, Op{}); };
    case DDL_INT64: return [](void* o, const void* a, const void* b, size_t n) { apply<int64_t>(o, a, b, n, Op{}); };
    case DDL_UINT8: return [](void* o, const void* a, const void* b, size_t n) { apply<uint8_t>(o, a, b, n, Op{}); };
    case DDL_INT8: return [](void* o, const void* a, const void* b, size_t n) { apply<int8_t>(o, a, b, n, Op{}); };
    case DDL_INT16: return [](void* o, const void* a, const void* b, size_t n) { apply<int16_t>(o, a, b, n, Op{}); };
    case DDL_BOOL:
    case DDL_UINT16:
    case DDL_UINT32:
    case DDL_UINT64: break;  // moved only
  }
  return nullptr;
}

// Integers divide as int64 (truncating toward zero): the world size itself may not fit T (256 ranks
// as a uint8 is 0, 128 as an int8 is -128), and the quotient always does.
template <typename T>
void divide(void* data, size_t n, int divisor) {
  auto* d = static_cast<T*>(data);
  if constexpr (std::is_integral_v<T>) {
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<int64_t>(d[i]) / divisor);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / static_cast<T>(divisor));
  }
}

// Integers scale in double and truncate toward zero; floats in their own precision.
template <typename T, typename Math>
void multiply(void* data, size_t n, Math factor) {
  auto* d = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<Math>(d[i]) * factor);
}

template <float (*ToFloat)(unsigned short), unsigned short (*FromFloat)(float)>
void multiply_16(void* data, size_t n, float factor) {
  auto* d = static_cast<unsigned short*>(data);
  for (size_t i = 0; i < n; ++i) d[i] = FromFloat(ToFloat(d[i]) * factor);
}

}  // namespace

ReduceFunction reduce_function(ddl_dtype dtype, ddl_reduce_op op) {
  switch (op) {
    case DDL_SUM:
    case DDL_AVERAGE: return for_dtype<Sum>(dtype);
    case DDL_PRODUCT: return for_dtype<Product>(dtype);
    case DDL_MIN: return for_dtype<Min>(dtype);
    case DDL_MAX: return for_dtype<Max>(dtype);
  }
  return nullptr;
}

void divide_by_world_size(void* data, size_t n, ddl_dtype dtype, int divisor) {
  switch (dtype) {
    case DDL_FLOAT16: {
      auto* d = static_cast<unsigned short*>(data);
      for (size_t i = 0; i < n; ++i) d[i] = float_to_half(half_to_float(d[i]) / static_cast<float>(divisor));
      return;
    }
    case DDL_BFLOAT16: {
      auto* d = static_cast<unsigned short*>(data);
      for (size_t i = 0; i < n; ++i) d[i] = float_to_bfloat16(bfloat16_to_float(d[i]) / static_cast<float>(divisor));
      return;
    }
    case DDL_FLOAT32: return divide<float>(data, n, divisor);
    case DDL_FLOAT64: return divide<double>(data, n, divisor);
    case DDL_INT32: return divide<int32_t>(data, n, divisor);
    case DDL_INT64: return divide<int64_t>(data, n, divisor);
    case DDL_UINT8: return divide<uint8_t>(data, n, divisor);
    case DDL_INT8: return divide<int8_t>(data, n, divisor);
    case DDL_INT16: return divide<int16_t>(data, n, divisor);
    case DDL_BOOL:
    case DDL_UINT16:
    case DDL_UINT32:
    case DDL_UINT64: return;  // moved only
  }
}

namespace {

template <typename T>
T identity_of(ddl_reduce_op op) {
  using Limits = std::numeric_limits<T>;
  switch (op) {
    case DDL_MIN: return Limits::has_infinity ? Limits::infinity() : Limits::max();
    case DDL_MAX: return Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
    case DDL_PRODUCT: return T(1);
    default: return T(0);
  }
}

template <typename T>
void fill_as(void* data, size_t n, T value) {
  std::fill_n(static_cast<T*>(data), n, value);
}

}  // namespace

void fill_identity(void* data, size_t n, ddl_dtype dtype, ddl_reduce_op op) {
  switch (dtype) {
    case DDL_FLOAT16: return fill_as(data, n, float_to_half(identity_of<float>(op)));
    case DDL_BFLOAT16: return fill_as(data, n, float_to_bfloat16(identity_of<float>(op)));
    case DDL_FLOAT32: return fill_as(data, n, identity_of<float>(op));
    case DDL_FLOAT64: return fill_as(data, n, identity_of<double>(op));
    case DDL_INT32: return fill_as(data, n, identity_of<int32_t>(op));
    case DDL_INT64: return fill_as(data, n, identity_of<int64_t>(op));
    case DDL_UINT8: return fill_as(data, n, identity_of<uint8_t>(op));
    case DDL_INT8: return fill_as(data, n, identity_of<int8_t>(op));
    case DDL_INT16: return fill_as(data, n, identity_of<int16_t>(op));
    case DDL_BOOL:
    case DDL_UINT16:
    case DDL_UINT32:
    case DDL_UINT64: return;  // moved only
  }
}

void scale(void* data, size_t n, ddl_dtype dtype, double factor) {
  if (factor == 1.0) return;
  const auto f = static_cast<float>(factor);
  switch (dtype) {
    case DDL_FLOAT16: return multiply_16<half_to_float, float_to_half>(data, n, f);
    case DDL_BFLOAT16: return multiply_16<bfloat16_to_float, float_to_bfloat16>(data, n, f);
    case DDL_FLOAT32: return multiply<float>(data, n, f);
    case DDL_FLOAT64: return multiply<double>(data, n, factor);
    case DDL_INT32: return multiply<int32_t>(data, n, factor);
    case DDL_INT64: return multiply<int64_t>(data, n, factor);
    case DDL_UINT8: return multiply<uint8_t>(data, n, factor);
    case DDL_INT8: return multiply<int8_t>(data, n, factor);
    case DDL_INT16: return multiply<int16_t>(data, n, factor);
    case DDL_BOOL:
    case DDL_UINT16:
    case DDL_UINT32:
    case DDL_UINT64: return;  // moved only
  }
}

}  // namespace ddl::runtime
