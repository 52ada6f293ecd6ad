#include "smp/cpus.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <string>
#include <string_view>

#include "metad/config.hpp"
#include "metad/log.hpp"

namespace metad {

bool parse_cpu_list(std::string_view text, int cpu_max, std::vector<int>& cpus) {
  const std::size_t before = cpus.size();
  auto number = [](std::string_view digits, int& value) {
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    return ec == std::errc{} && end == digits.data() + digits.size();
  };
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    const std::size_t dash = item.find('-');
    int first = 0, last = 0;
    if (!number(item.substr(0, dash), first)) return false;
    if (dash == std::string_view::npos)
      last = first;
    else if (!number(item.substr(dash + 1), last))
      return false;
    if (first < 0 || last < first || last > cpu_max) return false;
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return cpus.size() > before;
}

}  // namespace metad

namespace metad::smp {

namespace {

// The CPUs of the mask that share the NUMA node of its first one (the whole mask where
// sysfs does not say): default threads stay on one node, beside their memory.
std::vector<int> same_node(const std::vector<int>& mask) {
  for (int node = 0; node < 1024; ++node) {
    std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
    if (!in) {
      if (node == 0) continue;  // node 0 may be offline (or memory-only)
      break;
    }
    std::string text;
    std::getline(in, text);
    std::vector<int> cpus;
    if (!metad::parse_cpu_list(text, CPU_SETSIZE - 1, cpus) ||
        std::find(cpus.begin(), cpus.end(), mask.front()) == cpus.end())
      continue;
    std::vector<int> mine;
    for (int cpu : mask)
      if (std::find(cpus.begin(), cpus.end(), cpu) != cpus.end()) mine.push_back(cpu);
    return mine;
  }
  return mask;
}

}  // namespace

std::vector<int> affinity_cpus(int threads) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> mask;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) mask.push_back(cpu);
  if (mask.empty()) mask.push_back(0);
  if (threads <= 0) {
    std::vector<int> cpus = same_node(mask);
    cpus.resize(std::min<std::size_t>(cpus.size(), metad::config::default_threads));
    return cpus;
  }
  std::vector<int> cpus;
  for (int i = 0; i < threads; ++i) cpus.push_back(mask[static_cast<std::size_t>(i) % mask.size()]);
  return cpus;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
    log::warn("cannot pin to CPU {}", cpu);
}

}  // namespace metad::smp
