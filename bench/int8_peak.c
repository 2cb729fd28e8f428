// The int8 multiply-add peak of one core on the AVX2 route (docs/PERFORMANCE.md,
// "CPU prefill on AVX2 beside llama.cpp"):
//   gcc -O2 -mavx2 -o /tmp/int8_peak bench/int8_peak.c && taskset -c 1 /tmp/int8_peak
// 6 independent chains of maddubs (32 u8 x i8 products) -> madd(ones) -> add,
// every operand in a register. Prints GMAC/s per core.
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#define STEP(a, acc) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones))
int main(void) {
    __m256i b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3);
    __m256i a3 = _mm256_set1_epi8(4), a4 = _mm256_set1_epi8(5), a5 = _mm256_set1_epi8(6);
    __m256i c0 = a0, c1 = a1, c2 = a2, c3 = a3, c4 = a4, c5 = a5;
    long iters = 200000000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long it = 0; it < iters; it++) {
        STEP(a0, c0); STEP(a1, c1); STEP(a2, c2); STEP(a3, c3); STEP(a4, c4); STEP(a5, c5);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(b));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                 _mm256_add_epi32(c4, c5));
    printf("%.1f GMAC/s per core (%.3f ns per maddubs+madd+add) [%d]\n",
           iters * 6.0 * 32 / s / 1e9, s / (iters * 6.0) * 1e9, _mm256_extract_epi32(t, 0));
    return 0;
}
