#include "runtime/src/core/copy_bytes.hpp"
#include "runtime/src/transports/collectives.hpp"

namespace ddl::runtime {

namespace {

class SingleProcess final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<std::string> allgather_bytes(const std::string& mine) override { return {mine}; }
  void allreduce(void* /*data*/, size_t /*bytes*/, size_t /*element_size*/, ReduceFunction /*reduce*/) override {
  }  // one contribution: already the result
  void broadcast(void* /*data*/, size_t /*bytes*/, int /*root*/) override {}
  void allgatherv(const void* send, void* recv, const std::vector<size_t>& bytes) override {
    if (send != recv) move_bytes(recv, send, bytes[0]);
  }
  void alltoall(const void* send, void* recv, size_t bytes) override {
    if (send != recv) move_bytes(recv, send, bytes);
  }
  void barrier() override {}
};

}  // namespace

std::unique_ptr<Collectives> make_single_process_collectives() { return std::make_unique<SingleProcess>(); }

}  // namespace ddl::runtime
