// The Metal emulator's stand-in for <metal_stdlib>: enough of the Metal Shading Language, with
// Metal's execution semantics, to compile the project's real .metal source as C++20 and run it on
// CPU threads. The build places this file where `#include <metal_stdlib>` finds it.
//
// Model: one std::thread per Metal thread of a threadgroup; threadgroups of a dispatch run one after
// another on the same threads. threadgroup_barrier is a barrier over the threadgroup's threads,
// simdgroup_barrier one over the 32 lanes of a simdgroup, and threadgroup memory is one exactly-sized
// heap block shared by the threadgroup, so AddressSanitizer sees overruns of it and ThreadSanitizer
// sees unsynchronised accesses to it (both are real bugs on a GPU).
//
// Order matters: every system header is included and all runtime code written BEFORE the Metal
// address-space words (thread, device, constant, threadgroup, kernel) become macros, because those
// are ordinary identifiers in the standard library (std::thread).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;

// Metal's bfloat: storage is the top 16 bits of a float; conversion from float rounds to nearest even
// as the GPU does. Arithmetic goes through float, like every bfloat op in the kernels.
struct bfloat {
  uint16_t bits = 0;
  bfloat() = default;
  explicit bfloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = (uint16_t)((u >> 16) | 0x40u);  // keep NaN a NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = (uint16_t)(u >> 16);
    }
  }
  operator float() const {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct uint3 { uint x, y, z; };
struct ulong2 {
  ulong x, y;
  ulong2(ulong v = 0) : x(v), y(v) {}
  ulong2(ulong a, ulong b) : x(a), y(b) {}
};

template <typename To, typename From>
inline To as_type(From v) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of equal size");
  To out;
  std::memcpy(&out, &v, sizeof(To));
  return out;
}

namespace uqr_emu {

constexpr uint kSimdWidth = 32;

// A blocking barrier. std::barrier may spin before it sleeps, and with 128 emulated threads on a
// 2-core machine spinning threads compete with the ones doing work; a mutex and condition variable
// sleep at once, ThreadSanitizer understands their happens-before edges, and a timed wait lets a
// barrier that can never complete report itself.
class Barrier {
 public:
  static constexpr int kBarrierTimeoutSeconds = 120;
  explicit Barrier(uint count) : count_(count), waiting_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long gen = generation_;
    if (--waiting_ == 0) {
      ++generation_;
      waiting_ = count_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, std::chrono::seconds(kBarrierTimeoutSeconds),
                             [&] { return generation_ != gen; })) {
      // On a GPU a barrier some threads never reach is undefined behaviour (often a hang); say so
      // instead of hanging the test run.
      std::fprintf(stderr, "metal-emu: %u of %u threads never reached a barrier (a barrier under "
                   "divergent control flow, or an early return?)\n", waiting_, count_);
      std::abort();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const uint count_;
  uint waiting_;
  unsigned long generation_ = 0;
};

// What one emulated thread needs to find its threadgroup's synchronisation objects.
struct ThreadCtx {
  Barrier* tg_barrier = nullptr;
  Barrier* sg_barrier = nullptr;
  uint lane = 0;
};
inline thread_local ThreadCtx tls;

// A kernel as the dispatcher calls it: buffers bound by position (x, w, y, params), threadgroup
// memory, then the thread's position (threadgroup in grid, index in threadgroup, simdgroup, lane).
using Kernel = std::function<void(void* const* buffers, uchar* shmem, uint3 tgpig, uint tiitg,
                                  uint sgitg, uint tiisg)>;

inline std::map<std::string, Kernel>& registry() {
  static std::map<std::string, Kernel> r;
  return r;
}

// Registers one instantiated kernel under its Metal host name. Every kernel of the project has the
// signature (device const T* x, device const uchar* w, device T* y, constant P& p,
// threadgroup uchar* shmem, uint3 tgpig, uint tiitg, uint sgitg, uint tiisg), so binding by
// position is all the dispatcher needs (the [[buffer(i)]] attributes were stripped).
struct Registrar {
  template <typename T, typename P>
  Registrar(const char* name, void (*fn)(const T*, const uchar*, T*, P&, uchar*, uint3, uint, uint, uint)) {
    registry()[name] = [fn](void* const* b, uchar* sh, uint3 tg, uint t, uint s, uint l) {
      fn(static_cast<const T*>(b[0]), static_cast<const uchar*>(b[1]), static_cast<T*>(b[2]),
         *static_cast<P*>(b[3]), sh, tg, t, s, l);
    };
  }
};

// Runs a whole dispatch: `threads` emulated threads, threadgroup after threadgroup. Threadgroup
// memory is filled with 0xff bytes (NaN in half and float) before each threadgroup, so a kernel that
// reads a tile element it never wrote produces NaN instead of a stale value from the last tile.
inline void dispatch(const Kernel& k, void* const* buffers, uint3 grid, uint threads, size_t shmem_bytes) {
  const uint n_sg = (threads + kSimdWidth - 1) / kSimdWidth;
  std::unique_ptr<uchar[]> shmem(new uchar[shmem_bytes ? shmem_bytes : 1]);
  Barrier tg_barrier(threads);
  std::vector<std::unique_ptr<Barrier>> sg_barriers;
  for (uint s = 0; s < n_sg; ++s) {
    uint lanes = std::min(kSimdWidth, threads - s * kSimdWidth);
    sg_barriers.emplace_back(new Barrier(lanes));
  }
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (uint t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      tls.tg_barrier = &tg_barrier;
      tls.sg_barrier = sg_barriers[t / kSimdWidth].get();
      tls.lane = t % kSimdWidth;
      for (uint z = 0; z < grid.z; ++z)
        for (uint y = 0; y < grid.y; ++y)
          for (uint x = 0; x < grid.x; ++x) {
            if (t == 0) std::memset(shmem.get(), 0xff, shmem_bytes);
            tg_barrier.arrive_and_wait();
            k(buffers, shmem.get(), uint3{x, y, z}, t, t / kSimdWidth, t % kSimdWidth);
            // The next threadgroup reuses the memory: nobody may start it before all are done.
            tg_barrier.arrive_and_wait();
          }
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace uqr_emu

namespace metal {

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

inline void threadgroup_barrier(mem_flags) { uqr_emu::tls.tg_barrier->arrive_and_wait(); }
inline void simdgroup_barrier(mem_flags) { uqr_emu::tls.sg_barrier->arrive_and_wait(); }

using std::max;
using std::min;
using std::fma;
using std::abs;

// simdgroup_matrix: on the GPU each lane holds 2 of the 64 elements. Here a lane holds room for all
// 64 and is "full" after a load or fill (every lane loads the same tile), but a multiply-accumulate
// computes only the lane's own two elements (2*lane, 2*lane + 1 in row-major order), as the hardware
// does: 32x less emulation work, and a store writes only those two elements, so the 32 lanes write
// the tile once with no two threads writing the same address (the emulator must not invent races).
// A product used as the A or B operand of another multiply would need the other lanes' elements;
// the kernels never do that, and the emulator aborts rather than compute garbage if one starts to.
template <typename T, int Rows, int Cols>
struct simdgroup_matrix {
  static_assert(Rows == 8 && Cols == 8, "only 8x8 simdgroup matrices exist");
  T e[64];
  bool full = true;
};

template <typename T, int R, int C>
inline simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, R, C> m;
  for (int i = 0; i < 64; ++i) m.e[i] = v;
  return m;
}

template <typename T, typename U>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, const U* src, ulong elements_per_row = 8,
                           ulong2 origin = ulong2(0), bool transpose = false) {
  static_assert(std::is_same<T, U>::value, "simdgroup_load: matrix and memory types must match");
  const U* base = src + origin.y * elements_per_row + origin.x;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c)
      m.e[r * 8 + c] = transpose ? base[c * elements_per_row + r] : base[r * elements_per_row + c];
  m.full = true;
}

template <typename T, typename U>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, U* dst, ulong elements_per_row = 8,
                            ulong2 origin = ulong2(0), bool transpose = false) {
  static_assert(std::is_same<T, U>::value, "simdgroup_store: matrix and memory types must match");
  U* base = dst + origin.y * elements_per_row + origin.x;
  const uint lane = uqr_emu::tls.lane;
  for (uint i = 2 * lane; i < 2 * lane + 2; ++i) {
    uint r = i / 8, c = i % 8;
    if (transpose) base[c * elements_per_row + r] = m.e[i];
    else base[r * elements_per_row + c] = m.e[i];
  }
}

// D = A B + C for the lane's two elements, products and sums in fp32 as the hardware accumulates.
template <typename TD, typename TA, typename TB, typename TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b,
                                          const simdgroup_matrix<TC, 8, 8>& c) {
  if (!a.full || !b.full) {
    std::fprintf(stderr, "metal-emu: a multiply-accumulate result used as an A/B operand is not emulated\n");
    std::abort();
  }
  const uint lane = uqr_emu::tls.lane;
  for (uint i = 2 * lane; i < 2 * lane + 2; ++i) {
    const uint r = i / 8, col = i % 8;
    float acc = (float)c.e[i];
    for (uint k = 0; k < 8; ++k) acc += (float)a.e[r * 8 + k] * (float)b.e[k * 8 + col];
    d.e[i] = (TD)acc;
  }
  d.full = false;
}

}  // namespace metal

// From here on, Metal's address-space and function-kind words are macros. Address spaces carry no
// meaning in one flat CPU address space; `kernel` only marks an entry point.
#define device
#define thread
#define threadgroup
#define constant
#define kernel

#define UQR_METAL 1
#define UQR_METAL_EMU 1
