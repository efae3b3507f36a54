#include "cli/sites_command.hpp"

#include <cstdio>

#include <fmt/format.h>

#include "backends/site_profile.hpp"

namespace ddl::cli {

SitesCommand::SitesCommand(CLI::App& app) : name_(std::make_shared<std::string>()) {
  app_ = app.add_subcommand("sites", "List the site profiles, or show one with where each value came from");
  show_ = app_->add_subcommand("show", "Show one site profile");
  show_->add_option("name", *name_, "Site name")->required();
}

namespace {

// "nodes 1-2, up to 01:00:00": what a queue takes.
std::string queue_limits_said(const backends::QueueLimits& limits) {
  std::string nodes = limits.max_nodes > 0 ? fmt::format("nodes {}-{}", limits.min_nodes, limits.max_nodes)
                                           : fmt::format("nodes {} or more", limits.min_nodes);
  return limits.max_time.empty() ? nodes : fmt::format("{}, up to {}", nodes, limits.max_time);
}

}  // namespace

int SitesCommand::execute() const {
  if (!show_->parsed()) {
    const auto listed = backends::list_sites();
    int broken = 0;
    for (const auto& site : listed) {
      if (site.profile)
        std::printf("%-12s %-5s %s\n", site.name.c_str(), backends::scheduler_key(site.profile->scheduler),
                    site.profile->description.c_str());
      else
        std::printf("%-12s %-5s (broken: ddl sites show %s says why)\n", site.name.c_str(), "-", site.name.c_str());
    }
    std::printf("(user profiles: %s)\n", backends::user_sites_dir().c_str());
    std::fflush(stdout);
    for (const auto& site : listed) {
      if (site.profile) continue;
      std::fprintf(stderr, "ddl: error: %s\n", site.error.c_str());
      if (!site.hint.empty()) std::fprintf(stderr, "hint: %s\n", site.hint.c_str());
      ++broken;
    }
    return broken ? 2 : 0;
  }
  const auto p = backends::load_site(*name_);
  auto from = [&](const std::string& field) {
    auto it = p.origin.find(field);
    return it == p.origin.end() ? std::string("default") : it->second;
  };
  // A field whose origin is tracked under another key (a whole map's: "patterns", "queues") names it.
  auto row = [&](const std::string& field, const std::string& value, const std::string& origin_key = "") {
    std::printf("%-16s %-40s  [%s]\n", field.c_str(), value.c_str(), from(origin_key.empty() ? field : origin_key).c_str());
  };
  std::printf("site %s\n", p.name.c_str());
  row("description", p.description);
  row("scheduler", backends::scheduler_key(p.scheduler));
  row("login_host", p.login_host);
  row("gpus_per_node", std::to_string(p.gpus_per_node));
  row("cores_per_node", std::to_string(p.cores_per_node));
  row("gpu_vendor", p.gpu_vendor);
  row("launcher", p.launcher);
  row("gpu_order", p.gpu_order);
  for (const auto& [option, value] : p.defaults) row("defaults." + option, value);
  row("required", fmt::format("{}", fmt::join(p.required, ", ")));
  for (const auto& [option, rule] : p.patterns) row("patterns." + option, rule.regex, "patterns");
  for (const auto& [option, why] : p.forbidden) row("forbidden." + option, why, "forbidden");
  if (p.max_cores_per_gpu > 0) row("max_cores_per_gpu", std::to_string(p.max_cores_per_gpu));
  for (const auto& [queue, limits] : p.queues) row("queues." + queue, queue_limits_said(limits), "queues");
  for (const auto& [partition, shape] : p.partitions)
    row("partitions." + partition, fmt::format("{} GPU(s), {} cores per node", shape.gpus_per_node, shape.cores_per_node), "partitions");
  row("gpu_request", p.gpu_request);
  row("directives", fmt::format("{}", fmt::join(p.directives, " | ")));
  row("module_use", fmt::format("{}", fmt::join(p.module_use, " ")));
  row("modules", fmt::format("{}", fmt::join(p.modules, " ")));
  row("setup", fmt::format("{}", fmt::join(p.setup, " ; ")));
  for (const auto& [name, value] : p.environment) row("environment." + name, value, "environment");
  if (p.container) row("container", fmt::format("{}: {}", p.container->kind, fmt::join(p.container->wrap, " ")));
  if (p.hang_timeout > 0) row("hang_timeout", std::to_string(p.hang_timeout));
  if (!p.nccl_network.empty()) {
    row("nccl_network", p.nccl_network);
    row("nccl_network_fix", p.nccl_network_fix);
  }
  if (p.match) {
    if (!p.match->hostname.empty()) row("match.hostname", p.match->hostname, "match");
    for (const auto& [name, pattern] : p.match->environment) row("match.environment." + name, pattern, "match");
  }
  row("notes", p.notes);
  return 0;
}

}  // namespace ddl::cli
