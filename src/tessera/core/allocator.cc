#include "tessera/core/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string_view>
#include <vector>

namespace tessera {

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Parameters:
      return "parameters";
    case MemCategory::Gradients:
      return "gradients";
    case MemCategory::OptimizerState:
      return "optimizer state";
    case MemCategory::Activations:
      return "activations";
    case MemCategory::Buffers:
      return "buffers";
    case MemCategory::Other:
      return "other";
  }
  return "?";
}

namespace {

// Transparent huge pages for the 2 MiB-aligned inside of a large block, where the kernel gives
// them only on request (THP "madvise", Debian's default): a first touch then faults 2 MiB at a
// time instead of 4 KiB, which is most of what a first large host copy costs on a VM. Off with
// TESSERA_HUGE_PAGES=0.
void advise_huge_pages(void* p, size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  static const bool on = [] {
    const char* v = std::getenv("TESSERA_HUGE_PAGES");
    return v == nullptr || std::string_view(v) != "0";
  }();
  if (!on || bytes < 2 * kHuge) return;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (a + kHuge - 1) / kHuge * kHuge, end = (a + bytes) / kHuge * kHuge;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

}  // namespace

Allocator::Allocator(std::string name, size_t capacity_bytes, Backing backing)
    : name_(std::move(name)), backing_(backing), capacity_(capacity_bytes) {}

void* Allocator::allocate(size_t bytes, MemCategory cat, std::string_view tag) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (capacity_ != 0 && in_use_ + bytes > capacity_) {
      std::vector<std::pair<size_t, std::string>> top;
      for (const auto& [t, b] : holders_) top.emplace_back(b, t);
      std::sort(top.rbegin(), top.rend());
      std::string msg =
          detail::concat(name_, ": out of memory: requested ", format_bytes(bytes), " for '", tag,
                         "' (", mem_category_name(cat), ") with ", format_bytes(in_use_), " of ",
                         format_bytes(capacity_), " in use; largest holders:");
      for (size_t i = 0; i < std::min<size_t>(5, top.size()); ++i)
        msg += detail::concat(i ? "; " : " ", top[i].second, " ", format_bytes(top[i].first));
      throw OutOfMemory(msg);
    }
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    auto ci = static_cast<int>(cat);
    cat_in_use_[ci] += bytes;
    cat_peak_[ci] = std::max(cat_peak_[ci], cat_in_use_[ci]);
    auto it = holders_.find(tag);
    if (it == holders_.end())
      holders_.emplace(std::string(tag), bytes);
    else
      it->second += bytes;
  }
  if (bytes == 0) return nullptr;
  if (counts_only()) {  // address space, never touched (page-aligned, so 64-byte aligned too)
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) return p;
    deallocate(nullptr, bytes, cat, tag);
    throw OutOfMemory(detail::concat(name_, ": the operating system refused ", format_bytes(bytes),
                                     " of address space for '", tag, "'"));
  }
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    deallocate(nullptr, bytes, cat, tag);
    throw OutOfMemory(detail::concat(name_, ": the operating system refused ", format_bytes(bytes),
                                     " for '", tag, "'"));
  }
  advise_huge_pages(p, bytes);
  return p;
}

void Allocator::deallocate(void* p, size_t bytes, MemCategory cat, std::string_view tag) {
  if (counts_only()) {
    if (p != nullptr) munmap(p, bytes);
  } else {
    std::free(p);
  }
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= bytes;
  cat_in_use_[static_cast<int>(cat)] -= bytes;
  auto it = holders_.find(tag);
  if (it != holders_.end()) {
    it->second -= bytes;
    if (it->second == 0) holders_.erase(it);
  }
}

size_t Allocator::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}
void Allocator::set_capacity(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = bytes;
}
size_t Allocator::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
size_t Allocator::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}
size_t Allocator::in_use(MemCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return cat_in_use_[static_cast<int>(c)];
}
size_t Allocator::peak(MemCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return cat_peak_[static_cast<int>(c)];
}
void Allocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
  cat_peak_ = cat_in_use_;
}

std::string Allocator::report() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s = detail::concat(name_, ": peak ", format_bytes(peak_), " (in use ",
                                 format_bytes(in_use_), ")");
  for (int c = 0; c < kNumMemCategories; ++c) {
    if (cat_peak_[c] == 0) continue;
    s += detail::concat("; ", mem_category_name(static_cast<MemCategory>(c)), " ",
                        format_bytes(cat_peak_[c]));
  }
  return s;
}

namespace {
Allocator& process_allocator() {
  static Allocator a("process", 0);
  return a;
}
thread_local Allocator* t_current = nullptr;
}  // namespace

Allocator& Allocator::current() {
  return t_current ? *t_current : process_allocator();
}

CurrentAllocatorScope::CurrentAllocatorScope(Allocator& a) : previous_(t_current) {
  t_current = &a;
}
CurrentAllocatorScope::~CurrentAllocatorScope() {
  t_current = previous_;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}

size_t parse_bytes(std::string_view text) {
  std::string s(text);
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (const std::exception&) {
    throw ConfigError(detail::concat("cannot read '", text,
                                     "' as a size: expected a number with an optional unit "
                                     "(B, KB, MB, GB, KiB, MiB, GiB), e.g. 2GiB"));
  }
  std::string unit;
  for (size_t i = pos; i < s.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(s[i])))
      unit += static_cast<char>(std::tolower(s[i]));
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "kb" || unit == "k")
    mult = 1e3;
  else if (unit == "mb" || unit == "m")
    mult = 1e6;
  else if (unit == "gb" || unit == "g")
    mult = 1e9;
  else if (unit == "kib")
    mult = 1024.0;
  else if (unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  if (mult == 0 || value < 0)
    throw ConfigError(detail::concat("cannot read '", text,
                                     "' as a size: units are B, KB, MB, GB, KiB, MiB, GiB, TiB"));
  return static_cast<size_t>(value * mult);
}

}  // namespace tessera
