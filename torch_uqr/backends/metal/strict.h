// A declarations-only stand-in for <metal_stdlib> for the strict CI compile of the shaders
// (torch_uqr/metal_emu/strict.py): clang parses the Metal branch of the real source (__METAL_VERSION__
// defined, so the same #if branches Apple's compiler takes) with Metal's address spaces as DISTINCT
// clang address spaces. A pointer or reference passed across address spaces, which Apple's compiler
// rejects and the emulator (where every address-space word is an empty macro) accepts, is an error.
//
// Nothing here runs: functions are declared, not defined, and the target (aarch64, for _Float16 and
// __fp16) only matters to the type checker. Unqualified locals live in the default address space,
// which is therefore Metal's `thread` space.
#pragma once

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define kernel

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
// A builtin 16-bit float type distinct from half, converting to and from float as Metal's bfloat
// does. (A class would not do: clang cannot call a member function on an object in another
// address space, e.g. convert a `device bfloat` element.)
typedef __fp16 bfloat;

struct uint3 {
  uint x, y, z;
};
struct ulong2 {
  ulong x, y;
  ulong2(ulong v = 0);
  ulong2(ulong a, ulong b);
};

template <typename To, typename From>
To as_type(From v);

namespace metal {

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);

template <typename T>
T min(T a, T b);
template <typename T>
T max(T a, T b);
float fma(float a, float b, float c);
half fma(half a, half b, half c);
float abs(float a);
int abs(int a);

template <typename T, int Rows, int Cols>
struct simdgroup_matrix {
  static_assert(Rows == 8 && Cols == 8, "only 8x8 simdgroup matrices exist");
  T lanes[2];
};

template <typename T, int R, int C>
simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v);

// Metal overloads these per address space (device and threadgroup); the element type must be the
// matrix's.
template <typename T>
void simdgroup_load(thread simdgroup_matrix<T, 8, 8>& m, const threadgroup T* src, ulong elements_per_row = 8,
                    ulong2 origin = ulong2(0), bool transpose = false);
template <typename T>
void simdgroup_load(thread simdgroup_matrix<T, 8, 8>& m, const device T* src, ulong elements_per_row = 8,
                    ulong2 origin = ulong2(0), bool transpose = false);
template <typename T>
void simdgroup_store(thread const simdgroup_matrix<T, 8, 8>& m, threadgroup T* dst, ulong elements_per_row = 8,
                     ulong2 origin = ulong2(0), bool transpose = false);
template <typename T>
void simdgroup_store(thread const simdgroup_matrix<T, 8, 8>& m, device T* dst, ulong elements_per_row = 8,
                     ulong2 origin = ulong2(0), bool transpose = false);
template <typename TD, typename TA, typename TB, typename TC>
void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, 8, 8>& d, thread const simdgroup_matrix<TA, 8, 8>& a,
                                   thread const simdgroup_matrix<TB, 8, 8>& b,
                                   thread const simdgroup_matrix<TC, 8, 8>& c);

}  // namespace metal
