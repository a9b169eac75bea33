// A fixture for CTest kernel_entry_catches_violation: two kernels the check
// must report (reads before the wait; no wait) and three it must pass.
// A comment that names __global__ defines nothing.
__global__ void declared_only(float* out);

__global__ void waits_first(float* out) {
  wait_for_previous_kernel();
  out[0] = 1.f;
}

template <int N>
__global__ void __launch_bounds__(256) waits_first_qualified(float* out) {
  gpu::wait_for_previous_kernel();
  out[N] = 1.f;
}

__global__ void reads_before_the_wait(const float* in, float* out) {
  const float x = in[0];
  wait_for_previous_kernel();
  out[0] = x;
}

template <int N>
__global__ void __launch_bounds__(128) never_waits(float* out) {
  out[N] = 2.f;
}
