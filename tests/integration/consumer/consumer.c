/* Sums the ranks with libddl's C API and prints "rank R of N: sum S". */
#include <stdio.h>

#include <ddl/ddl.h>

int main(void) {
  int rank = 0, size = 0;
  if (ddl_init() != DDL_SUCCESS || ddl_rank(&rank) != DDL_SUCCESS || ddl_size(&size) != DDL_SUCCESS) {
    fprintf(stderr, "error: %s\n", ddl_last_error());
    return 1;
  }
  long long value = rank;
  if (ddl_allreduce("ranks", &value, &value, 1, DDL_INT64, DDL_SUM) != DDL_SUCCESS) {
    fprintf(stderr, "error: %s\n", ddl_last_error());
    return 1;
  }
  printf("rank %d of %d: sum %lld\n", rank, size, value);
  return ddl_finalize() == DDL_SUCCESS ? 0 : 1;
}
