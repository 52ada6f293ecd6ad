// zeroed_array: a fixed-size, zero-filled array of trivially copyable T for the big hash
// tables, built so that a table's growth never stops its core for long:
// - from 64 KB up it is its own anonymous mapping, zero without a memset (calloc would
//   clear heap memory below glibc's mmap threshold); smaller ones come from calloc;
// - its pages can be faulted in a few at a time ahead of use (prefault), instead of all
//   at once (a 30 MB table costs ~7,000 page faults, milliseconds) or one by one as
//   random inserts first touch them (two faults each: read, then write);
// - the part of an old table that has been moved out goes back to the system page by
//   page (drop_prefix) while the rest is still in use.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

namespace metad::shard {

template <class T>
class zeroed_array {
  static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 64);

 public:
  static constexpr std::size_t page_bytes = 4096;

  zeroed_array() = default;
  static constexpr std::size_t mapped_from = 64 * 1024;

  explicit zeroed_array(std::size_t n) : size_(n) {
    if (n == 0) return;
    if (bytes() >= mapped_from) {
      void* at =
          ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (at == MAP_FAILED) throw std::bad_alloc();
      raw_ = at;
      data_ = static_cast<T*>(at);  // page-aligned
      return;
    }
    raw_ = std::calloc(bytes(), 1);
    if (raw_ == nullptr) throw std::bad_alloc();
    const auto at = (reinterpret_cast<std::uintptr_t>(raw_) + 63) & ~std::uintptr_t{63};
    data_ = reinterpret_cast<T*>(at);
  }
  ~zeroed_array() {
    if (raw_ == nullptr) return;
    if (bytes() >= mapped_from) {
      ::munmap(raw_, bytes());
    } else {
      std::free(raw_);
    }
  }
  zeroed_array(const zeroed_array&) = delete;
  zeroed_array& operator=(const zeroed_array&) = delete;
  zeroed_array(zeroed_array&& o) noexcept { swap(o); }
  zeroed_array& operator=(zeroed_array&& o) noexcept {
    zeroed_array(std::move(o)).swap(*this);
    return *this;
  }
  void swap(zeroed_array& o) noexcept {
    std::swap(raw_, o.raw_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(faulted_, o.faulted_);
    std::swap(dropped_, o.dropped_);
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  // Bytes held, with 64 bytes of room to align a calloc'd block to a cache line.
  std::size_t bytes() const { return size_ == 0 ? 0 : size_ * sizeof(T) + 64; }

  // Pages the array spans, and those not yet faulted in by prefault().
  std::size_t pages() const { return (bytes() + page_bytes - 1) / page_bytes; }
  std::size_t pages_left() const { return (bytes() - faulted_ + page_bytes - 1) / page_bytes; }
  // Faults in the next `pages` pages (writable, zero): one madvise where the kernel has
  // MADV_POPULATE_WRITE (5.14), else one write per page.
  void prefault(std::size_t pages) {
    const std::size_t len = std::min(pages * page_bytes, bytes() - faulted_);
    if (len == 0) return;
    char* from = static_cast<char*>(raw_) + faulted_;
#ifdef MADV_POPULATE_WRITE
    const auto page_start = reinterpret_cast<std::uintptr_t>(from) & ~(page_bytes - 1);
    const std::size_t span = reinterpret_cast<std::uintptr_t>(from) + len - page_start;
    if (::madvise(reinterpret_cast<void*>(page_start), span, MADV_POPULATE_WRITE) != 0)
#endif
      for (std::size_t i = 0; i < len; i += page_bytes)
        reinterpret_cast<volatile char*>(from)[i] = 0;  // zero already: faults the page in
    faulted_ += len;
  }

  // Elements [0, n) will not be read or written again: the pages wholly inside them go
  // back to the system (in steps of at least 256 KB, so the calls stay few). They read
  // as zero if touched. Nothing of malloc's own bookkeeping lies in those pages.
  void drop_prefix(std::size_t n) {
    constexpr std::uintptr_t step = 256 * 1024;
    const auto begin = reinterpret_cast<std::uintptr_t>(data_);
    const std::uintptr_t first = (begin + page_bytes - 1) & ~(page_bytes - 1);
    const std::uintptr_t end = (begin + n * sizeof(T)) & ~(page_bytes - 1);
    const std::uintptr_t from = first + dropped_;
    if (end < from + step) return;
    if (::madvise(reinterpret_cast<void*>(from), end - from, MADV_DONTNEED) == 0)
      dropped_ = end - first;
  }

 private:
  void* raw_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t faulted_ = 0;  // bytes from raw_ prefaulted
  std::size_t dropped_ = 0;  // bytes from the first whole page of data_ handed back
};

}  // namespace metad::shard
