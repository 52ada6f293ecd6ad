#include "smp/request_task.hpp"

#include <cstdlib>
#include <vector>

namespace metad::smp {
namespace {

// Frames of one size class per thread; request coroutines have few distinct sizes.
constexpr std::size_t kFrameClassBytes = 512;
constexpr std::size_t kFramesKept = 1024;

struct pool {
  std::vector<void*> free_frames[8];
  pool() {
    for (auto& list : free_frames) list.reserve(kFramesKept);  // release() never allocates
  }
  ~pool() {
    for (auto& list : free_frames)
      for (void* f : list) std::free(f);
  }
};
thread_local pool frames;

std::size_t size_class(std::size_t bytes) {
  return (bytes + kFrameClassBytes - 1) / kFrameClassBytes;
}

}  // namespace

void* frame_pool::allocate(std::size_t bytes) {
  const std::size_t cls = size_class(bytes);
  if (cls < 8 && !frames.free_frames[cls].empty()) {
    void* f = frames.free_frames[cls].back();
    frames.free_frames[cls].pop_back();
    return f;
  }
  void* f = std::malloc(cls * kFrameClassBytes);
  if (f == nullptr) throw std::bad_alloc();
  return f;
}

void frame_pool::release(void* frame, std::size_t bytes) noexcept {
  const std::size_t cls = size_class(bytes);
  if (cls < 8 && frames.free_frames[cls].size() < kFramesKept) {
    frames.free_frames[cls].push_back(frame);
    return;
  }
  std::free(frame);
}

}  // namespace metad::smp
