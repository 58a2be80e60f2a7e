// What every rn50 C++ shim needs at its C boundary: exceptions turned into a non-zero return with the message
// kept per thread (each shim exposes it through its own *_last_error()), and tch tensor handles gathered into
// a vector. Everything is in an anonymous namespace: one copy per translation unit (rn50's shims share one,
// crates/shim/cpp/rn50shim.cpp; c10d.cpp has its own). A failed call's message is read before the next call.
#pragma once

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <vector>

namespace {
thread_local std::string last_error;

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    // what() carries a C++ backtrace; the message alone is what a user needs.
    last_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return 1;
}

std::vector<at::Tensor> gather(at::Tensor** ts, size_t n) {
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.push_back(*ts[i]);
  return v;
}
}  // namespace
