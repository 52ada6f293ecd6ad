// The CPUs the core threads run on: which ones by default, and pinning a thread to one.
#pragma once

#include <vector>

namespace metad::smp {

// `threads` CPUs of the affinity mask, in order, wrapping around; threads <= 0: up to
// config::default_threads CPUs of the mask's first NUMA node.
std::vector<int> affinity_cpus(int threads);

// Pins the calling thread to `cpu` (a warning if it cannot).
void pin_to(int cpu);

}  // namespace metad::smp
