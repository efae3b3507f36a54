#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/src/core/dtype.hpp"

using namespace ddl::runtime;

TEST_CASE("float16 encodes and decodes exactly where it can") {
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(-2.0f) == 0xc000);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(0.0f) == 0x0000);
  CHECK(float_to_half(5.9604645e-08f) == 0x0001);  // smallest subnormal
  CHECK(half_to_float(0x3555) == doctest::Approx(0.333251953125));
  for (unsigned h = 0; h < 0x7c00; ++h)  // every finite positive half survives a round trip
    REQUIRE(float_to_half(half_to_float(static_cast<unsigned short>(h))) == h);
}

TEST_CASE("float16 rounds to nearest even and saturates to infinity") {
  CHECK(float_to_half(1.0f + 1.0f / 2048) == 0x3c00);  // half way, even stays
  CHECK(float_to_half(1.0f + 3.0f / 2048) == 0x3c02);  // half way, odd rounds up
  CHECK(float_to_half(65520.0f) == 0x7c00);
  CHECK(float_to_half(1e6f) == 0x7c00);
  CHECK(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(half_to_float(0x7c00)));
}

TEST_CASE("bfloat16 keeps the float exponent and rounds the mantissa") {
  CHECK(float_to_bfloat16(1.0f) == 0x3f80);
  CHECK(bfloat16_to_float(0x4049) == doctest::Approx(3.140625));
  CHECK(float_to_bfloat16(1.0f + 1.0f / 256) == 0x3f80);  // half way, even
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("reduce functions combine element by element") {
  std::vector<int32_t> a{1, 5, -3}, b{4, 2, -7}, out(3);
  reduce_function(DDL_INT32, DDL_SUM)(out.data(), a.data(), b.data(), 3);
  CHECK(out == std::vector<int32_t>{5, 7, -10});
  reduce_function(DDL_INT32, DDL_MIN)(out.data(), a.data(), b.data(), 3);
  CHECK(out == std::vector<int32_t>{1, 2, -7});
  reduce_function(DDL_INT32, DDL_MAX)(out.data(), a.data(), b.data(), 3);
  CHECK(out == std::vector<int32_t>{4, 5, -3});
  reduce_function(DDL_INT32, DDL_PRODUCT)(out.data(), a.data(), b.data(), 3);
  CHECK(out == std::vector<int32_t>{4, 10, 21});
  std::vector<unsigned short> h1{float_to_half(1.5f)}, h2{float_to_half(2.25f)}, h3(1);
  reduce_function(DDL_FLOAT16, DDL_SUM)(h3.data(), h1.data(), h2.data(), 1);
  CHECK(half_to_float(h3[0]) == 3.75f);
}

TEST_CASE("MIN and MAX give NaN where either operand is NaN, whichever rank's it was") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ddl_reduce_op op : {DDL_MIN, DDL_MAX}) {
    std::vector<float> a{nan, 1.0f, 2.0f}, b{3.0f, nan, 0.5f}, out(3);
    reduce_function(DDL_FLOAT32, op)(out.data(), a.data(), b.data(), 3);
    CHECK(std::isnan(out[0]));
    CHECK(std::isnan(out[1]));
    CHECK(out[2] == (op == DDL_MIN ? 0.5f : 2.0f));
    std::vector<double> d1{1.0}, d2{std::nan("")}, d3(1);
    reduce_function(DDL_FLOAT64, op)(d3.data(), d1.data(), d2.data(), 1);
    CHECK(std::isnan(d3[0]));
    for (ddl_dtype half : {DDL_FLOAT16, DDL_BFLOAT16}) {
      std::vector<unsigned short> h1{half == DDL_FLOAT16 ? float_to_half(1.0f) : float_to_bfloat16(1.0f)},
          h2{half == DDL_FLOAT16 ? float_to_half(nan) : float_to_bfloat16(nan)}, h3(1);
      reduce_function(half, op)(h3.data(), h1.data(), h2.data(), 1);
      CHECK(std::isnan(half == DDL_FLOAT16 ? half_to_float(h3[0]) : bfloat16_to_float(h3[0])));
    }
  }
}

TEST_CASE("average divides by the world size; integers truncate toward zero") {
  std::vector<int64_t> ints{7, -7, 8};
  divide_by_world_size(ints.data(), 3, DDL_INT64, 2);
  CHECK(ints == std::vector<int64_t>{3, -3, 4});
  std::vector<double> d{3.0};
  divide_by_world_size(d.data(), 1, DDL_FLOAT64, 4);
  CHECK(d[0] == 0.75);
  // A world larger than the element type holds: divided as the world size, not as its wrapped cast.
  std::vector<int8_t> i8{-128, 100};
  divide_by_world_size(i8.data(), 2, DDL_INT8, 128);
  CHECK(i8 == std::vector<int8_t>{-1, 0});
  std::vector<uint8_t> u8{200};
  divide_by_world_size(u8.data(), 1, DDL_UINT8, 256);  // was a division by zero (SIGFPE)
  CHECK(u8[0] == 0);
  std::vector<int16_t> i16{30000};
  divide_by_world_size(i16.data(), 1, DDL_INT16, 40000);
  CHECK(i16[0] == 0);
}

TEST_CASE("element sizes") {
  CHECK(dtype_size(DDL_FLOAT16) == 2);
  CHECK(dtype_size(DDL_BFLOAT16) == 2);
  CHECK(dtype_size(DDL_FLOAT32) == 4);
  CHECK(dtype_size(DDL_INT64) == 8);
  CHECK(dtype_size(DDL_UINT8) == 1);
  CHECK(dtype_size(DDL_INT8) == 1);
  CHECK(dtype_size(DDL_INT16) == 2);
  CHECK(valid_dtype(DDL_INT16));
  CHECK(dtype_size(DDL_BOOL) == 1);
  CHECK(dtype_size(DDL_UINT16) == 2);
  CHECK(dtype_size(DDL_UINT32) == 4);
  CHECK(dtype_size(DDL_UINT64) == 8);
  CHECK(std::string(dtype_name(DDL_BOOL)) == "bool");
  CHECK(std::string(dtype_name(DDL_UINT64)) == "uint64");
  CHECK(valid_dtype(DDL_UINT64));
  CHECK_FALSE(valid_dtype(13));
  CHECK(reducible_dtype(DDL_INT16));
  for (ddl_dtype moved : {DDL_BOOL, DDL_UINT16, DDL_UINT32, DDL_UINT64}) {
    CHECK_FALSE(reducible_dtype(moved));
    const bool has_arithmetic = reduce_function(moved, DDL_SUM) != nullptr;
    CHECK_FALSE(has_arithmetic);
  }
  CHECK_FALSE(valid_reduce_op(-1));
}

TEST_CASE("the 8- and 16-bit integer types reduce in their own width") {
  std::vector<int8_t> a{-100, 3}, b{-50, 4}, out(2);
  reduce_function(DDL_INT8, DDL_MIN)(out.data(), a.data(), b.data(), 2);
  CHECK(out == std::vector<int8_t>{-100, 3});
  std::vector<uint8_t> u1{200, 7}, u2{50, 8}, u3(2);
  reduce_function(DDL_UINT8, DDL_SUM)(u3.data(), u1.data(), u2.data(), 2);
  CHECK(u3 == std::vector<uint8_t>{250, 15});
  std::vector<int16_t> s1{-300, 12}, s2{2, 3}, s3(2);
  reduce_function(DDL_INT16, DDL_PRODUCT)(s3.data(), s1.data(), s2.data(), 2);
  CHECK(s3 == std::vector<int16_t>{-600, 36});
}

TEST_CASE("scaling follows Horovod: integers in double truncated toward zero, half through float") {
  std::vector<int32_t> ints{7, -7, 3};
  scale(ints.data(), 3, DDL_INT32, 0.5);
  CHECK(ints == std::vector<int32_t>{3, -3, 1});
  std::vector<float> f{2.0f, -1.0f};
  scale(f.data(), 2, DDL_FLOAT32, 0.1);
  CHECK(f == std::vector<float>{2.0f * 0.1f, -1.0f * 0.1f});
  std::vector<unsigned short> h{float_to_half(3.0f)};
  scale(h.data(), 1, DDL_FLOAT16, 0.5);
  CHECK(half_to_float(h[0]) == 1.5f);
  std::vector<double> unchanged{1.0 / 3};
  scale(unchanged.data(), 1, DDL_FLOAT64, 1.0);
  CHECK(unchanged[0] == 1.0 / 3);
}

// A joined rank contributes fill_identity's values: reducing them with any value gives that value.
TEST_CASE("each reduction's identity leaves every value of every type as it is") {
  const std::vector<double> values = {-3.0, -0.5, 0.0, 0.25, 7.0, 100.0};
  for (int d = DDL_FLOAT16; d <= DDL_INT16; ++d) {
    const auto dtype = static_cast<ddl_dtype>(d);
    const size_t element = dtype_size(dtype);
    std::vector<char> data(values.size() * element);
    for (size_t i = 0; i < values.size(); ++i) {
      double v = values[i];
      if (dtype == DDL_UINT8) v = std::fabs(v);
      std::vector<char> one(element);
      switch (dtype) {
        case DDL_FLOAT16: *reinterpret_cast<unsigned short*>(one.data()) = float_to_half(static_cast<float>(v)); break;
        case DDL_BFLOAT16: *reinterpret_cast<unsigned short*>(one.data()) = float_to_bfloat16(static_cast<float>(v)); break;
        case DDL_FLOAT32: *reinterpret_cast<float*>(one.data()) = static_cast<float>(v); break;
        case DDL_FLOAT64: *reinterpret_cast<double*>(one.data()) = v; break;
        case DDL_INT32: *reinterpret_cast<int32_t*>(one.data()) = static_cast<int32_t>(v); break;
        case DDL_INT64: *reinterpret_cast<int64_t*>(one.data()) = static_cast<int64_t>(v); break;
        case DDL_UINT8: *reinterpret_cast<uint8_t*>(one.data()) = static_cast<uint8_t>(v); break;
        case DDL_INT8: *reinterpret_cast<int8_t*>(one.data()) = static_cast<int8_t>(v); break;
        case DDL_INT16: *reinterpret_cast<int16_t*>(one.data()) = static_cast<int16_t>(v); break;
        case DDL_BOOL:
        case DDL_UINT16:
        case DDL_UINT32:
        case DDL_UINT64: break;  // moved only: the loop stops before them
      }
      std::copy(one.begin(), one.end(), data.begin() + static_cast<long>(i * element));
    }
    for (ddl_reduce_op op : {DDL_SUM, DDL_AVERAGE, DDL_MIN, DDL_MAX, DDL_PRODUCT}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(reduce_op_name(op));
      std::vector<char> identity(data.size());
      fill_identity(identity.data(), values.size(), dtype, op);
      std::vector<char> out(data.size());
      reduce_function(dtype, op)(out.data(), data.data(), identity.data(), values.size());
      CHECK(out == data);
      reduce_function(dtype, op)(out.data(), identity.data(), data.data(), values.size());
      CHECK(out == data);
    }
  }
}
