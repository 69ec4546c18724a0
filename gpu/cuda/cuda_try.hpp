#pragma once
// CUDA error handling of the `cuda` backend: every runtime call is checked, and a failure becomes a
// Status that names the call, the CUDA error and the source location. Host-compilable (no nvcc).

#include <cuda_runtime_api.h>

#include <string>

#include "core/status.hpp"

namespace strata::gpu::cuda_detail {

/// Internal status for a failed CUDA call: "cudaMalloc(&p, n) failed at file:line: cudaErrorX (text)".
inline Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  return Status::internal(std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                          cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

/// Hands a failed call's status to `sink.record_error(Status)` (the device's sticky error) and
/// returns false; returns true on success. Used where no Status can be returned (async issue calls).
template <class Sink>
bool record_if_error(Sink& sink, cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return true;
  sink.record_error(cuda_status(err, expr, file, line));
  return false;
}

/// Runs `call` (a runtime call whose error Strata handles itself: it returns it) so that its failure
/// does not stay behind as the thread's last error, which a trainer linking the same static runtime
/// reads with cudaGetLastError: the error is taken back only when none was pending before, so an
/// error the trainer left pending is never cleared (the runtime keeps one error a thread: a failure
/// of `call` replaces a pending one, and then stays). Returns the call's error.
template <class Call>
cudaError_t call_quietly(Call&& call) {
  const cudaError_t pending = cudaPeekAtLastError();
  const cudaError_t err = call();
  if (err != cudaSuccess && pending == cudaSuccess) (void)cudaGetLastError();
  return err;
}

}  // namespace strata::gpu::cuda_detail

/// Evaluates a CUDA runtime call and returns an Internal Status (call, error, file, line) from the
/// enclosing function when it fails. The enclosing function returns Status or Result<T>.
#define STRATA_CUDA_TRY(expr)                                                                      \
  do {                                                                                             \
    const cudaError_t strata_cuda_err_ = (expr);                                                   \
    if (strata_cuda_err_ != cudaSuccess)                                                           \
      return ::strata::gpu::cuda_detail::cuda_status(strata_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

/// For void contexts: evaluates a CUDA runtime call; on failure records the error (call, file,
/// line) as the sticky error of `sink` (anything with record_error(Status)). Yields true on success.
#define STRATA_CUDA_RECORD(sink, expr) \
  ::strata::gpu::cuda_detail::record_if_error((sink), (expr), #expr, __FILE__, __LINE__)
