// Data-parallel training of a small MLP on libddl, in plain C++ (no framework).
//
// Run it with ddl, which starts the workers and gives each its rank and the rendezvous store:
//
//     ./build/cli/ddl run -np 4 -- ./build/examples/cpp_train
//     ./build/cli/ddl run -np 2 -- ./build/examples/cpp_train --epochs 20 --batch 32
//     ./build/examples/cpp_train            # no launcher: a world of one process
//
// What it does:
//
// 1. Joins the world with ddl_init().
// 2. Builds a regression task: targets come from a fixed random "teacher" MLP (the same on every
//    rank, from a fixed seed); each rank draws its own shard of inputs from a seed that depends on
//    its rank.
// 3. Initializes the student MLP (8 -> 32 tanh -> 1). Every rank initializes it from its own seed,
//    then rank 0's weights are broadcast (ddl_broadcast, one per tensor) so every rank starts from
//    the same weights.
// 4. Trains with plain SGD on the mean squared error. Each step, each rank computes gradients on
//    its own minibatch and averages them over ranks like a framework would: one asynchronous,
//    named allreduce per parameter tensor ("grad/w1", "grad/b1", "grad/w2", "grad/b2"), all
//    submitted first and then waited for, so libddl's engine can fuse them into one buffer.
// 5. Prints on rank 0 the loss of each epoch, averaged over ranks (an allreduce).
// 6. Checks that the replicas stayed identical: every rank hashes its weights (FNV-1a 64 over
//    their bytes), the hashes are allgathered, and rank 0 compares them (exit 1 if they differ).
//
// Flags: --epochs N (10), --steps-per-epoch N (16), --batch N (64, per worker), --lr X (0.3).
// Takes a few seconds with 4 workers on 2 cores. Any failing ddl call prints
// "error: <what>: <ddl_last_error()>" to stderr and exits 1.
//
// Everything the program draws is fixed by its seeds, so a run with 1 or 2 workers gives the same
// weights, bit for bit, every time. With 3 or more, the last bits can differ from run to run:
// which gradients libddl fuses into one allreduce depends on timing, and that changes the order
// in which the ranks' float values are added. The replicas still agree with each other. For
// bit-identical runs, turn fusion off: DDL_FUSION_THRESHOLD=0.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numbers>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddl/ddl.h"

namespace {

constexpr int kInputs = 8;
constexpr int kHidden = 32;         // the student's hidden layer
constexpr int kTeacherHidden = 16;  // the teacher's hidden layer
constexpr uint64_t kTeacherSeed = 1234;
constexpr float kTeacherGain = 2.0f;  // larger: a less linear teacher, harder to fit
constexpr uint64_t kModelSeed = 42;
constexpr uint64_t kDataSeed = 1000;

// ---- Errors ---------------------------------------------------------------------------------

// Ends the program if a ddl call failed. std::_Exit skips static destructors: libddl's would
// wait for the other ranks to finalize, and they may be waiting for this one. `ddl run` stops the
// other workers as soon as this one fails.
void check(ddl_status status, const std::string& what) {
  if (status == DDL_SUCCESS) return;
  std::fprintf(stderr, "error: %s: %s\n", what.c_str(), ddl_last_error());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

// printf on rank 0 only, flushed at once so the launcher forwards it right away.
[[gnu::format(printf, 2, 3)]] void log0(int rank, const char* format, ...) {
  if (rank != 0) return;
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::fflush(stdout);
}

// ---- Command line ---------------------------------------------------------------------------

struct Options {
  int epochs = 10;
  int steps_per_epoch = 16;
  int batch = 64;
  float lr = 0.3f;
};

constexpr const char* kUsage = "usage: %s [--epochs N] [--steps-per-epoch N] [--batch N] [--lr X]\n";

[[noreturn]] void bad_usage(const char* program, const std::string& problem) {
  std::fprintf(stderr, "error: %s\n", problem.c_str());
  std::fprintf(stderr, kUsage, program);
  std::exit(2);
}

int positive_int(const char* program, std::string_view flag, const char* text) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < 1 || v > 1'000'000)
    bad_usage(program, std::string(flag) + " wants a whole number from 1 to 1000000, not '" + text + "'");
  return static_cast<int>(v);
}

float positive_float(const char* program, std::string_view flag, const char* text) {
  char* end = nullptr;
  float v = std::strtof(text, &end);
  if (*text == '\0' || *end != '\0' || !(v > 0) || !std::isfinite(v))
    bad_usage(program, std::string(flag) + " wants a positive number, not '" + text + "'");
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf(kUsage, argv[0]);
      std::exit(0);
    }
    if (flag != "--epochs" && flag != "--steps-per-epoch" && flag != "--batch" && flag != "--lr")
      bad_usage(argv[0], "unknown flag: " + std::string(flag));
    if (i + 1 >= argc) bad_usage(argv[0], std::string(flag) + " needs a value");
    const char* value = argv[++i];
    if (flag == "--epochs")
      o.epochs = positive_int(argv[0], flag, value);
    else if (flag == "--steps-per-epoch")
      o.steps_per_epoch = positive_int(argv[0], flag, value);
    else if (flag == "--batch")
      o.batch = positive_int(argv[0], flag, value);
    else
      o.lr = positive_float(argv[0], flag, value);
  }
  if (static_cast<long>(o.steps_per_epoch) * o.batch > 10'000'000)
    bad_usage(argv[0], "--steps-per-epoch times --batch (the samples per worker) must be at most 10000000");
  return o;
}

// ---- Random numbers (our own, so every platform and rank draws the same) --------------------

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {  // SplitMix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {                                                           // Box-Muller
    double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

// ---- The model ------------------------------------------------------------------------------

constexpr size_t kTensors = 4;  // w1, b1, w2, b2

// An MLP with one tanh hidden layer and one output: y = w2 . tanh(w1 x + b1) + b2.
// Gradients use the same struct.
struct Mlp {
  int inputs = 0, hidden = 0;
  std::vector<float> w1, b1, w2, b2;  // w1 is hidden x inputs, row-major; w2 is 1 x hidden

  Mlp(int inputs_, int hidden_)
      : inputs(inputs_),
        hidden(hidden_),
        w1(static_cast<size_t>(hidden_) * static_cast<size_t>(inputs_)),
        b1(static_cast<size_t>(hidden_)),
        w2(static_cast<size_t>(hidden_)),
        b2(1) {}

  // Every parameter tensor with its name, always in this order.
  std::array<std::pair<const char*, std::span<float>>, kTensors> tensors() { return {{{"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2}}}; }
};

// Weights ~ N(0, 1/fan_in), the hidden layer's scaled by `hidden_gain` and the output layer's by
// `output_scale`; biases zero.
Mlp random_mlp(int inputs, int hidden, uint64_t seed, float hidden_gain, float output_scale) {
  Mlp m(inputs, hidden);
  Rng rng(seed);
  for (float& w : m.w1) w = static_cast<float>(hidden_gain * rng.normal() / std::sqrt(static_cast<double>(inputs)));
  for (float& w : m.w2) w = static_cast<float>(output_scale * rng.normal() / std::sqrt(static_cast<double>(hidden)));
  return m;
}

// The hidden activations for one input.
void hidden_layer(const Mlp& m, const float* x, float* h) {
  for (int j = 0; j < m.hidden; ++j) {
    float z = m.b1[static_cast<size_t>(j)];
    for (int k = 0; k < m.inputs; ++k) z += m.w1[static_cast<size_t>(j) * static_cast<size_t>(m.inputs) + static_cast<size_t>(k)] * x[k];
    h[j] = std::tanh(z);
  }
}

float output_layer(const Mlp& m, const float* h) {
  float y = m.b2[0];
  for (int j = 0; j < m.hidden; ++j) y += m.w2[static_cast<size_t>(j)] * h[j];
  return y;
}

float predict(const Mlp& m, const float* x) {
  std::vector<float> h(static_cast<size_t>(m.hidden));
  hidden_layer(m, x, h.data());
  return output_layer(m, h.data());
}

// ---- Data -----------------------------------------------------------------------------------

struct Dataset {
  std::vector<float> x;  // samples x kInputs, row-major
  std::vector<float> y;  // samples
};

// This rank's shard: inputs from a rank-dependent seed, targets from the shared teacher.
Dataset make_shard(const Mlp& teacher, int rank, size_t samples) {
  Dataset d{std::vector<float>(samples * kInputs), std::vector<float>(samples)};
  Rng rng(kDataSeed + static_cast<uint64_t>(rank));
  for (float& v : d.x) v = static_cast<float>(rng.normal());
  for (size_t i = 0; i < samples; ++i) d.y[i] = predict(teacher, &d.x[i * kInputs]);
  return d;
}

// ---- Training -------------------------------------------------------------------------------

// Mean squared error of samples [first, first + count) and its gradient (into `grad`), by
// backpropagation one sample at a time.
float loss_and_gradient(const Mlp& m, const Dataset& d, size_t first, size_t count, Mlp& grad) {
  for (auto& [name, g] : grad.tensors()) std::fill(g.begin(), g.end(), 0.0f);
  std::vector<float> h(static_cast<size_t>(m.hidden));
  float loss = 0.0f;
  for (size_t i = first; i < first + count; ++i) {
    const float* x = &d.x[i * kInputs];
    hidden_layer(m, x, h.data());
    const float error = output_layer(m, h.data()) - d.y[i];
    loss += error * error;
    const float dy = 2.0f * error / static_cast<float>(count);  // d(loss)/d(output)
    grad.b2[0] += dy;
    for (int j = 0; j < m.hidden; ++j) {
      grad.w2[static_cast<size_t>(j)] += dy * h[static_cast<size_t>(j)];
      const float dz = dy * m.w2[static_cast<size_t>(j)] * (1.0f - h[static_cast<size_t>(j)] * h[static_cast<size_t>(j)]);  // through tanh
      grad.b1[static_cast<size_t>(j)] += dz;
      for (int k = 0; k < m.inputs; ++k)
        grad.w1[static_cast<size_t>(j) * static_cast<size_t>(m.inputs) + static_cast<size_t>(k)] += dz * x[k];
    }
  }
  return loss / static_cast<float>(count);
}

// Every rank's rank-0 copy: one broadcast per tensor ("init/w1", ...).
void broadcast_from_rank0(Mlp& model) {
  for (auto& [name, t] : model.tensors()) {
    const std::string op = std::string("init/") + name;
    check(ddl_broadcast(op.c_str(), t.data(), t.size(), DDL_FLOAT32, 0), "broadcast " + op);
  }
}

// Averages the gradients over ranks in place: one async allreduce per tensor, all submitted before
// any is waited for, so the engine can negotiate and fuse them together.
void average_gradients(Mlp& grad) {
  auto tensors = grad.tensors();
  std::array<ddl_handle, kTensors> handles{};
  std::array<std::string, kTensors> names;
  for (size_t i = 0; i < kTensors; ++i) {
    auto& [name, g] = tensors[i];
    names[i] = std::string("grad/") + name;
    check(ddl_allreduce_async(names[i].c_str(), g.data(), g.data(), g.size(), DDL_FLOAT32, DDL_AVERAGE, &handles[i]),
          "submit allreduce " + names[i]);
  }
  for (size_t i = 0; i < kTensors; ++i) check(ddl_wait(handles[i]), "allreduce " + names[i]);
}

void sgd_step(Mlp& model, Mlp& grad, float lr) {
  auto params = model.tensors();
  auto grads = grad.tensors();
  for (size_t t = 0; t < kTensors; ++t)
    for (size_t i = 0; i < params[t].second.size(); ++i) params[t].second[i] -= lr * grads[t].second[i];
}

// The mean over ranks of each rank's mean loss.
double average_over_ranks(double value, const std::string& name) {
  check(ddl_allreduce(name.c_str(), &value, &value, 1, DDL_FLOAT64, DDL_AVERAGE), "allreduce " + name);
  return value;
}

// The mean squared error over this rank's whole shard, without training.
double evaluate(const Mlp& model, const Dataset& data) {
  double total = 0.0;
  for (size_t i = 0; i < data.y.size(); ++i) {
    const double error = predict(model, &data.x[i * kInputs]) - data.y[i];
    total += error * error;
  }
  return total / static_cast<double>(data.y.size());
}

// One pass over this rank's shard; returns this rank's mean minibatch loss.
double train_epoch(Mlp& model, Mlp& grad, const Dataset& data, const Options& o) {
  double total = 0.0;
  for (int step = 0; step < o.steps_per_epoch; ++step) {
    total += loss_and_gradient(model, data, static_cast<size_t>(step) * static_cast<size_t>(o.batch), static_cast<size_t>(o.batch), grad);
    average_gradients(grad);
    sgd_step(model, grad, o.lr);
  }
  return total / o.steps_per_epoch;
}

// ---- Checking the replicas ------------------------------------------------------------------

// FNV-1a 64 over the raw bytes of every parameter tensor, in order.
uint64_t checksum(Mlp& model) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (auto& [name, t] : model.tensors()) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(t.data());
    for (size_t i = 0; i < t.size_bytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  }
  return hash;
}

// Every rank's checksum, in rank order.
std::vector<uint64_t> gather_checksums(uint64_t mine, int size) {
  std::vector<int64_t> all(static_cast<size_t>(size));
  const auto send = static_cast<int64_t>(mine);
  check(ddl_allgather("checksum", &send, all.data(), 1, DDL_INT64), "allgather checksum");
  return {all.begin(), all.end()};
}

// Rank 0 reports; returns false when some replica differs.
bool report_replicas(const std::vector<uint64_t>& sums) {
  bool same = true;
  for (uint64_t s : sums) same = same && s == sums[0];
  if (same) {
    std::printf("replicas identical: yes (checksum %016llx)\n", static_cast<unsigned long long>(sums[0]));
  } else {
    std::printf("replicas identical: NO\n");
    for (size_t r = 0; r < sums.size(); ++r) std::printf("  rank %zu checksum %016llx\n", r, static_cast<unsigned long long>(sums[r]));
  }
  std::fflush(stdout);
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  check(ddl_init(), "ddl_init");
  int rank = 0, size = 0;
  check(ddl_rank(&rank), "ddl_rank");
  check(ddl_size(&size), "ddl_size");

  const Mlp teacher = random_mlp(kInputs, kTeacherHidden, kTeacherSeed, kTeacherGain, 1.0f);
  const Dataset data = make_shard(teacher, rank, static_cast<size_t>(o.steps_per_epoch) * static_cast<size_t>(o.batch));
  // A different start on every rank, so that only the broadcast can make them equal.
  Mlp model = random_mlp(kInputs, kHidden, kModelSeed + static_cast<uint64_t>(rank), 1.0f, 0.1f);
  broadcast_from_rank0(model);
  log0(rank, "training an MLP %d-%d-1 on %d worker(s), batch %d per worker, lr %g\n", kInputs, kHidden, size, o.batch,
       static_cast<double>(o.lr));

  const double initial = average_over_ranks(evaluate(model, data), "loss/initial");
  log0(rank, "epoch 0/%d loss %.6f (before training)\n", o.epochs, initial);

  Mlp grad(kInputs, kHidden);
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const double mine = train_epoch(model, grad, data, o);
    const double loss = average_over_ranks(mine, "loss/epoch" + std::to_string(epoch));
    log0(rank, "epoch %d/%d loss %.6f\n", epoch, o.epochs, loss);
  }

  const std::vector<uint64_t> sums = gather_checksums(checksum(model), size);
  const bool same = rank != 0 || report_replicas(sums);
  check(ddl_finalize(), "ddl_finalize");
  return same ? 0 : 1;
}
