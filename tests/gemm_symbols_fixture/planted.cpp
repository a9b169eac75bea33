// For the CTest gemm_level_symbols_catches_sharing: an object with one weak
// symbol outside any renamed namespace (an inline function the compiler
// emits out of line), which check_gemm_symbols.cmake must report.
namespace hg_fixture {
inline __attribute__((noinline)) int planted_inline(int x) { return x * 3; }
int use(int x) { return planted_inline(x) + 1; }
}  // namespace hg_fixture
