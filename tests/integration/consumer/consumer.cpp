// Broadcasts rank 0's value with libddl's C++ API and prints "rank R got V".
#include <cstdio>
#include <vector>

#include <ddl/ddl.hpp>

int main() {
  ddl::Context ddl;
  std::vector<double> value{ddl.rank() == 0 ? 42.5 : -1.0};
  ddl.broadcast("value", std::span(value), 0);
  std::printf("rank %d got %g\n", ddl.rank(), value[0]);
  return 0;
}
