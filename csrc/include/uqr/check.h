// UQR_CHECK: TORCH_CHECK with a message that never formats a number through an std::ostream.
//
// On one H200 machine's toolchain every TORCH_CHECK whose message held an integer segfaulted
// instead of raising, while messages of strings, devices and dtypes raised. c10::str streams
// numbers through the locale's num_put facet, and that path, not ours, is what broke there (cause
// not established; docs/perf/history.md).
// std::to_string needs no locale, so the message is assembled here and handed to TORCH_CHECK as
// one std::string, which c10 passes through without streaming.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <string>
#include <type_traits>

namespace uqr {
namespace check_detail {

inline void put(std::string& s, const char* v) { s += v; }
inline void put(std::string& s, const std::string& v) { s += v; }
inline void put(std::string& s, c10::string_view v) { s.append(v.data(), v.size()); }
inline void put(std::string& s, char v) { s += v; }
inline void put(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void put(std::string& s, const c10::Device& v) { s += v.str(); }
// Same text as c10's printing of sizes and strides: [2, 3].
inline void put(std::string& s, c10::IntArrayRef v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += ']';
}
template <class T, std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value &&
                                        !std::is_same<T, char>::value, int> = 0>
void put(std::string& s, T v) {
  s += std::to_string(v);
}

}  // namespace check_detail

// The message of a failed check, built without streams (see above).
template <class... Args>
std::string check_message(const Args&... args) {
  std::string s;
  (check_detail::put(s, args), ...);
  return s;
}

}  // namespace uqr

#define UQR_CHECK(cond, ...) TORCH_CHECK(cond, ::uqr::check_message(__VA_ARGS__))
// A bad argument: raises ValueError in Python, as the Python API's own checks do.
#define UQR_CHECK_ARG(cond, ...) TORCH_CHECK_VALUE(cond, ::uqr::check_message(__VA_ARGS__))
