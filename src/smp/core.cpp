#include "smp/core.hpp"

#include "metad/log.hpp"

namespace metad::smp {

// The log prints the same thread-local (core=N on every line), so there is one of it.
int this_core() noexcept { return metad::log::current_core; }

core_scope::core_scope(int core) noexcept : outer_(metad::log::current_core) {
  metad::log::current_core = core;
}

core_scope::~core_scope() { metad::log::current_core = outer_; }

}  // namespace metad::smp
