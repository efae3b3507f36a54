#include "launcher/remote_job.hpp"

#include <algorithm>
#include <climits>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/hex.hpp"

namespace ddl::launcher {

using nlohmann::json;

namespace {
// The job format this ddl writes and reads; an agent refuses any other (decode_remote_job). It has
// per-node worker counts (node_sizes), relayed lines that always end in '\n', and the program's
// words, the environment and the directory as bytes (bytes_to_json).
constexpr int kJobFormat = 3;

// The program's words, the environment and the working directory are bytes, which JSON text holds
// only when they are UTF-8: the others travel as {"hex": "..."}, so every byte arrives as it was.
json bytes_to_json(const std::string& bytes) {
  try {
    (void)json(bytes).dump();
    return bytes;
  } catch (const json::type_error&) {
    return {{"hex", to_hex(bytes)}};
  }
}

std::string any_bytes_from_json(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  auto bytes = from_hex(j.at("hex").get<std::string>());
  if (!bytes) throw Error("the launching host sent a word whose hex is not an even number of lowercase hex digits");
  return *bytes;
}

// A word of a command line, a variable or a path: a NUL byte would cut it short where it is used.
std::string bytes_from_json(const json& j) {
  std::string bytes = any_bytes_from_json(j);
  if (bytes.find('\0') != std::string::npos) throw Error("the launching host sent a word with a NUL byte");
  return bytes;
}

// A whole number within [low, high] (JSON numbers may be fractions, which get<int> would truncate).
long long integer_at(const json& j, const char* key, long long low, long long high) {
  const json& value = j.at(key);
  if (!value.is_number_integer()) throw Error(fmt::format("the launching host sent a {} that is not a whole number", key));
  const auto number = value.get<long long>();
  if (value.is_number_unsigned() && value.get<unsigned long long>() > static_cast<unsigned long long>(high))
    throw Error(fmt::format("the launching host sent a {} out of range", key));
  if (number < low || number > high) throw Error(fmt::format("the launching host sent a {} out of range", key));
  return number;
}

json words_to_json(const std::vector<std::string>& words) {
  json out = json::array();
  for (const auto& word : words) out.push_back(bytes_to_json(word));
  return out;
}

std::vector<std::string> words_from_json(const json& j) {
  if (!j.is_array()) throw Error("the launching host sent a command that is not a list of words");
  std::vector<std::string> words;
  for (const auto& word : j) words.push_back(bytes_from_json(word));
  return words;
}

json environment_to_json(const Environment& env) {
  json out = json::array();
  for (const auto& [name, value] : env) out.push_back({bytes_to_json(name), bytes_to_json(value)});
  return out;
}

Environment environment_from_json(const json& j) {
  if (!j.is_array()) throw Error("the launching host sent an environment that is not a list of variables");
  Environment env;
  for (const auto& entry : j) {
    if (!entry.is_array() || entry.size() != 2) throw Error("the launching host sent an environment entry that is not a name and a value");
    std::string name = bytes_from_json(entry.at(0));
    if (name.empty() || name.find('=') != std::string::npos)
      throw Error("the launching host sent a variable name that is empty or holds '='");
    env[std::move(name)] = bytes_from_json(entry.at(1));
  }
  return env;
}
}  // namespace

std::string encode_remote_job(const RemoteJob& job) {
  json j = {{"format", kJobFormat},
            {"node_rank", job.node_rank},
            {"num_nodes", job.plan.num_nodes},
            {"workers_per_node", job.plan.workers_per_node},
            {"gpu_workers", job.plan.gpu_workers},
            {"gpu_order_reversed", job.gpu_order == GpuOrder::Reversed},
            {"share_gpus", job.share_gpus},
            {"run_id", job.run.run_id},
            {"store_addr", job.run.store_addr},
            {"store_token", job.run.store_token},
            {"master_addr", job.run.master_addr},
            {"master_port", job.run.master_port},
            {"restart_count", job.run.restart_count},
            {"max_restarts", job.run.max_restarts},
            {"command", words_to_json(job.command)},
            {"working_dir", bytes_to_json(job.working_dir)},
            {"env", environment_to_json(job.env)},
            {"grace_period_ms", job.grace_period_ms}};
  if (job.cpus_per_task) j["cpus_per_task"] = *job.cpus_per_task;
  if (job.gpus_if_present) j["gpus_if_present"] = true;
  if (job.hang_timeout_ms > 0) j["hang_timeout_ms"] = job.hang_timeout_ms;
  if (!job.plan.uniform()) j["node_sizes"] = job.plan.node_sizes;
  return j.dump();  // every string in it is UTF-8 (bytes_to_json)
}

RemoteJob decode_remote_job(const std::string& line) {
  try {
    const json j = json::parse(line);
    if (!j.at("format").is_number_integer() || j.at("format").get<int>() != kJobFormat)
      throw Error("the launching host's ddl speaks another job format", "install the same ddl version on every host");
    RemoteJob job;
    job.node_rank = static_cast<int>(integer_at(j, "node_rank", 0, kMostWorkers));
    job.plan.num_nodes = static_cast<int>(integer_at(j, "num_nodes", 1, kMostWorkers));
    job.plan.workers_per_node = static_cast<int>(integer_at(j, "workers_per_node", 1, kMostWorkers));
    job.plan.gpu_workers = j.at("gpu_workers").get<bool>();
    if (j.contains("node_sizes")) job.plan.node_sizes = j.at("node_sizes").get<std::vector<int>>();
    const auto& sizes = job.plan.node_sizes;
    if (!sizes.empty() && (static_cast<int>(sizes.size()) != job.plan.num_nodes || *std::min_element(sizes.begin(), sizes.end()) < 1 ||
                           std::accumulate(sizes.begin(), sizes.end(), 0LL) > kMostWorkers))
      throw Error("the launching host sent workers per node that do not match its node count");
    if (sizes.empty() && static_cast<long long>(job.plan.num_nodes) * job.plan.workers_per_node > kMostWorkers)
      throw Error("the launching host sent more workers than a run can have");
    if (job.node_rank < 0 || job.node_rank >= job.plan.num_nodes || job.plan.workers_per_node < 1)
      throw Error("the launching host sent a node rank outside its plan");
    job.gpu_order = j.at("gpu_order_reversed").get<bool>() ? GpuOrder::Reversed : GpuOrder::AsListed;
    job.share_gpus = j.at("share_gpus").get<bool>();
    job.gpus_if_present = j.contains("gpus_if_present") && j.at("gpus_if_present").get<bool>();
    job.run.run_id = j.at("run_id").get<std::string>();
    job.run.store_addr = j.at("store_addr").get<std::string>();
    job.run.store_token = j.at("store_token").get<std::string>();
    job.run.master_addr = j.at("master_addr").get<std::string>();
    job.run.master_port = static_cast<uint16_t>(integer_at(j, "master_port", 0, 65535));
    job.run.restart_count = j.at("restart_count").get<int>();
    job.run.max_restarts = j.at("max_restarts").get<int>();
    job.command = words_from_json(j.at("command"));
    job.working_dir = bytes_from_json(j.at("working_dir"));
    job.env = environment_from_json(j.at("env"));
    job.grace_period_ms = integer_at(j, "grace_period_ms", 0, 86'400'000);  // ddl run's --grace-period: a day at most
    if (j.contains("hang_timeout_ms")) job.hang_timeout_ms = integer_at(j, "hang_timeout_ms", 1, 365LL * 86'400'000);
    if (j.contains("cpus_per_task")) job.cpus_per_task = static_cast<int>(integer_at(j, "cpus_per_task", 1, 1 << 20));
    if (job.command.empty()) throw Error("the launching host sent no program");
    return job;
  } catch (const json::exception& e) {
    throw Error(std::string("cannot read the job the launching host sent: ") + e.what(),
                "install the same ddl version on every host; `ddl agent` is started by `ddl run -H`, not by hand");
  }
}

Environment forwarded_environment(const Environment& env) {
  static const char* const kHostOwn[] = {"HOSTNAME",
                                         "PWD",
                                         "OLDPWD",
                                         "SHLVL",
                                         "_",
                                         "SSH_CLIENT",
                                         "SSH_CONNECTION",
                                         "SSH_TTY",
                                         "SSH_AUTH_SOCK",
                                         "DISPLAY",
                                         "XAUTHORITY",
                                         "XDG_SESSION_ID",
                                         "XDG_RUNTIME_DIR",
                                         "TMUX",
                                         "TMUX_PANE",
                                         "STY",
                                         "WINDOW",
                                         "CUDA_VISIBLE_DEVICES",
                                         "ROCR_VISIBLE_DEVICES",
                                         "HIP_VISIBLE_DEVICES",
                                         "ZE_AFFINITY_MASK"};
  Environment out;
  for (const auto& [name, value] : env) {
    if (name.starts_with("SLURM_") || name.starts_with("PBS_") || name.starts_with("DDL_AGENT")) continue;
    if (std::find(std::begin(kHostOwn), std::end(kHostOwn), name) != std::end(kHostOwn)) continue;
    out.emplace(name, value);
  }
  return out;
}

}  // namespace ddl::launcher
