/* SAT's gate and fix-up as two loops over float32 CPU arrays (satrl.objectives.native loads this file).

   The torch path in sat.py is the reference: these loops compute the same candidates, the same gated tokens,
   the same kernel values and the same fix-up, bit for bit (tests/objectives/test_obj_native.py). Float
   arithmetic is written in the order torch evaluates it, and the file is compiled with -ffp-contract=off, so
   no multiply-add is fused and every value rounds as torch's does.

   sat_candidates: one pass over d. Candidates are the flat positions i whose key bits(d[i]) & 0x7FFFFFFF
   (the bits of |d[i]|, NaN included) is >= v, as the torch path's int32 compare of |d|'s bits. At each
   candidate it keeps d, the ratio and the advantage, so that the second loop reads them sequentially.
   sat_gate_fixup: one pass over the candidates. gated = |d| > q (NaN never); psi = 1 / (1 + (|d|/q)^2);
   hi = 1 + eps_high*psi, lo = 1 - eps_low*psi; hit = gated and (A > 0 and r > hi or A < 0 and r < lo), whose
   loss becomes the constant (hi or lo) * -A. It writes the gated tokens' positions, d, psi and the Table 10
   deficit terms, the hits' positions and values, and marks the gate map.

   Both have an AVX2 version (chosen at run time by __builtin_cpu_supports, so one build runs on any x86-64)
   and a scalar one, which is also the tail of the vector loop and the whole loop elsewhere. */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SAT_X86 1
#include <immintrin.h>
#endif

#define ABS_MASK 0x7FFFFFFF

static inline float as_float(int32_t b) { float f; memcpy(&f, &b, 4); return f; }

/* ------------------------------------------------------------------------------------- candidates */
static int64_t cand_scalar(const int32_t* d, const int32_t* r, const float* adv, int64_t cols, int64_t i,
                           int64_t n, int32_t v, int64_t* pos, int32_t* d_out, int32_t* r_out, float* a_out,
                           int64_t m, int64_t cap) {
    int64_t row = cols > 0 ? i / cols : 0, row_end = cols > 0 ? (row + 1) * cols : 0;
    for (; i < n; i++) {
        if (m >= cap) return -1;
        if (cols > 0 && i >= row_end) { row++; row_end += cols; }
        pos[m] = i; d_out[m] = d[i]; r_out[m] = r[i]; a_out[m] = cols > 0 ? adv[row] : adv[i];
        m += (d[i] & ABS_MASK) >= v;
    }
    return m;
}

#ifdef SAT_X86
/* LUT32[mask]: the set lanes of an 8-bit mask, packed to the left (a permutation for 32-bit lanes).
   LUT64[mask]: the same for a 4-bit mask over 64-bit lanes, as pairs of 32-bit lane indices. */
static int32_t LUT32[256][8] __attribute__((aligned(32)));
static int32_t LUT64[16][8] __attribute__((aligned(32)));
static int lut_ready = 0;

static void build_luts(void) {
    for (int mk = 0; mk < 256; mk++) {
        int k = 0;
        for (int b = 0; b < 8; b++) if (mk >> b & 1) LUT32[mk][k++] = b;
        for (; k < 8; k++) LUT32[mk][k] = 0;
    }
    for (int mk = 0; mk < 16; mk++) {
        int k = 0;
        for (int b = 0; b < 4; b++) if (mk >> b & 1) { LUT64[mk][2 * k] = 2 * b; LUT64[mk][2 * k + 1] = 2 * b + 1; k++; }
        for (; k < 4; k++) { LUT64[mk][2 * k] = 0; LUT64[mk][2 * k + 1] = 1; }
    }
    lut_ready = 1;
}

/* eight advantages for flat positions i..i+7: one row's value, or per token (cols == 0) */
__attribute__((target("avx2")))
static inline __m256 adv8(const float* adv, int64_t cols, int64_t i, int64_t* row, int64_t* row_end) {
    if (cols == 0) return _mm256_loadu_ps(adv + i);
    while (i >= *row_end) { (*row)++; *row_end += cols; }
    if (i + 8 <= *row_end) return _mm256_set1_ps(adv[*row]);
    float t[8];  /* the block straddles rows */
    for (int k = 0; k < 8; k++) t[k] = adv[(i + k) / cols];
    return _mm256_loadu_ps(t);
}

/* store the 64-bit lanes of two 4-lane vectors selected by an 8-bit mask, packed; returns how many */
__attribute__((target("avx2,popcnt")))
static inline int store64(int64_t* out, __m256i lo, __m256i hi, int mk) {
    int a = mk & 15, b = mk >> 4, na = __builtin_popcount(a);
    _mm256_storeu_si256((__m256i*)out, _mm256_permutevar8x32_epi32(lo, _mm256_load_si256((const __m256i*)LUT64[a])));
    _mm256_storeu_si256((__m256i*)(out + na), _mm256_permutevar8x32_epi32(hi, _mm256_load_si256((const __m256i*)LUT64[b])));
    return na + __builtin_popcount(b);
}

__attribute__((target("avx2,popcnt")))
static int64_t cand_avx2(const int32_t* d, const int32_t* r, const float* adv, int64_t cols, int64_t n,
                         int32_t v, int64_t* pos, int32_t* d_out, int32_t* r_out, float* a_out, int64_t cap) {
    const __m256i am = _mm256_set1_epi32(ABS_MASK), vm1 = _mm256_set1_epi32(v - 1);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t m = 0, i = 0, row = 0, row_end = cols;
    for (; i + 8 <= n; i += 8) {
        if (m + 8 > cap) return -1;
        __m256i db = _mm256_loadu_si256((const __m256i*)(d + i));
        /* keys and v are non-negative: key >= v is key > v - 1 as signed int32 */
        int mk = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_and_si256(db, am), vm1)));
        __m256i perm = _mm256_load_si256((const __m256i*)LUT32[mk]);
        __m256i rb = _mm256_loadu_si256((const __m256i*)(r + i));
        __m256 av = adv8(adv, cols, i, &row, &row_end);
        _mm256_storeu_si256((__m256i*)(d_out + m), _mm256_permutevar8x32_epi32(db, perm));
        _mm256_storeu_si256((__m256i*)(r_out + m), _mm256_permutevar8x32_epi32(rb, perm));
        _mm256_storeu_ps(a_out + m, _mm256_permutevar8x32_ps(av, perm));
        __m256i off = _mm256_permutevar8x32_epi32(lane, perm);
        __m256i base = _mm256_set1_epi64x(i);
        _mm256_storeu_si256((__m256i*)(pos + m), _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(off)), base));
        _mm256_storeu_si256((__m256i*)(pos + m + 4), _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(off, 1)), base));
        m += __builtin_popcount(mk);
    }
    return cand_scalar(d, r, adv, cols, i, n, v, pos, d_out, r_out, a_out, m, cap);
}
#endif

static int force_scalar = 0;  /* tests run the scalar loops on AVX2 machines too */

static int use_avx2(void) {
#ifdef SAT_X86
    static int cached = -1;
    if (force_scalar) return 0;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
        if (cached) build_luts();
    }
    return cached;
#else
    return 0;
#endif
}

/* Returns the number of candidates m, or -1 when more than cap - 8 would be needed (the caller retries
   with more room). adv: one value per row of cols tokens (cols > 0) or per token (cols == 0). */
int64_t sat_candidates(const int32_t* d, const int32_t* r, const float* adv, int64_t cols, int64_t n, int32_t v,
                       int64_t* pos, int32_t* d_out, int32_t* r_out, float* a_out, int64_t cap) {
#ifdef SAT_X86
    if (use_avx2()) return cand_avx2(d, r, adv, cols, n, v, pos, d_out, r_out, a_out, cap - 8);
#endif
    return cand_scalar(d, r, adv, cols, 0, n, v, pos, d_out, r_out, a_out, 0, cap);
}

/* --------------------------------------------------------------------------------- gate and fix-up */
typedef struct {
    float q, eh, el, hi_base, lo_base;
} sat_params;

/* counts[0] gated, counts[1] hits, counts[2] hits with A > 0 inside PPO's interval (r <= hi_base),
   counts[3] hits with A < 0 inside it (r >= lo_base); *cmin: the smallest psi among gated tokens (+inf if none) */
static void gate_scalar(const int64_t* pos, const int32_t* d, const float* r, const float* a, int64_t j, int64_t m,
                        sat_params p, int64_t* idx, float* d_out, float* psi_out, float* def_pos, float* def_neg,
                        int64_t* hit, float* val, int64_t* counts, float* cmin) {
    int64_t g = counts[0], h = counts[1], nh = counts[2], nl = counts[3];
    float mn = *cmin;
    for (; j < m; j++) {
        float dj = as_float(d[j]), s = as_float(d[j] & ABS_MASK);
        float rel = s / p.q;
        float psi = 1.0f / (rel * rel + 1.0f);
        float hi = 1.0f + p.eh * psi, lo = 1.0f - p.el * psi, deficit = 1.0f - psi;
        float aj = a[j], rj = r[j];
        int gt = s > p.q;
        int up = (aj > 0.0f) & (rj > hi), dn = (aj < 0.0f) & (rj < lo), ht = gt & (up | dn);
        idx[g] = pos[j]; d_out[g] = dj; psi_out[g] = psi;
        def_pos[g] = dj > 0.0f ? deficit : 0.0f; def_neg[g] = dj < 0.0f ? deficit : 0.0f;
        if (gt && psi < mn) mn = psi;
        g += gt;
        hit[h] = pos[j]; val[h] = (up ? hi : lo) * -aj;
        h += ht;
        nh += ht & up & !(rj > p.hi_base);
        nl += ht & dn & !(rj < p.lo_base);
    }
    counts[0] = g; counts[1] = h; counts[2] = nh; counts[3] = nl;
    *cmin = mn;
}

#ifdef SAT_X86
__attribute__((target("avx2,popcnt")))
static void gate_avx2(const int64_t* pos, const int32_t* d, const float* r, const float* a, int64_t m, sat_params p,
                      int64_t* idx, float* d_out, float* psi_out, float* def_pos, float* def_neg, int64_t* hit,
                      float* val, int64_t* counts, float* cmin) {
    const __m256i am = _mm256_set1_epi32(ABS_MASK);
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    const __m256 q = _mm256_set1_ps(p.q), eh = _mm256_set1_ps(p.eh), el = _mm256_set1_ps(p.el);
    const __m256 hib = _mm256_set1_ps(p.hi_base), lob = _mm256_set1_ps(p.lo_base);
    __m256 mn = _mm256_set1_ps(*cmin);
    int64_t g = 0, h = 0, nh = 0, nl = 0, j = 0;
    for (; j + 8 <= m; j += 8) {
        __m256i db = _mm256_loadu_si256((const __m256i*)(d + j));
        __m256 dj = _mm256_castsi256_ps(db), s = _mm256_castsi256_ps(_mm256_and_si256(db, am));
        __m256 rel = _mm256_div_ps(s, q);
        __m256 psi = _mm256_div_ps(one, _mm256_add_ps(_mm256_mul_ps(rel, rel), one));
        __m256 hi = _mm256_add_ps(one, _mm256_mul_ps(eh, psi)), lo = _mm256_sub_ps(one, _mm256_mul_ps(el, psi));
        __m256 deficit = _mm256_sub_ps(one, psi);
        __m256 aj = _mm256_loadu_ps(a + j), rj = _mm256_loadu_ps(r + j);
        __m256 gt = _mm256_cmp_ps(s, q, _CMP_GT_OQ);
        __m256 up = _mm256_and_ps(_mm256_cmp_ps(aj, zero, _CMP_GT_OQ), _mm256_cmp_ps(rj, hi, _CMP_GT_OQ));
        __m256 dn = _mm256_and_ps(_mm256_cmp_ps(aj, zero, _CMP_LT_OQ), _mm256_cmp_ps(rj, lo, _CMP_LT_OQ));
        __m256 ht = _mm256_and_ps(gt, _mm256_or_ps(up, dn));
        __m256 value = _mm256_mul_ps(_mm256_blendv_ps(lo, hi, up), _mm256_xor_ps(aj, sign));
        __m256 dpos = _mm256_and_ps(deficit, _mm256_cmp_ps(dj, zero, _CMP_GT_OQ));
        __m256 dneg = _mm256_and_ps(deficit, _mm256_cmp_ps(dj, zero, _CMP_LT_OQ));
        mn = _mm256_min_ps(mn, _mm256_blendv_ps(_mm256_set1_ps(__builtin_inff()), psi, gt));
        int gk = _mm256_movemask_ps(gt), hk = _mm256_movemask_ps(ht);
        nh += __builtin_popcount(_mm256_movemask_ps(_mm256_and_ps(_mm256_and_ps(ht, up), _mm256_cmp_ps(rj, hib, _CMP_NGT_UQ))));
        nl += __builtin_popcount(_mm256_movemask_ps(_mm256_and_ps(_mm256_and_ps(ht, dn), _mm256_cmp_ps(rj, lob, _CMP_NLT_UQ))));
        __m256i gp = _mm256_load_si256((const __m256i*)LUT32[gk]);
        _mm256_storeu_ps(d_out + g, _mm256_permutevar8x32_ps(dj, gp));
        _mm256_storeu_ps(psi_out + g, _mm256_permutevar8x32_ps(psi, gp));
        _mm256_storeu_ps(def_pos + g, _mm256_permutevar8x32_ps(dpos, gp));
        _mm256_storeu_ps(def_neg + g, _mm256_permutevar8x32_ps(dneg, gp));
        __m256i p0 = _mm256_loadu_si256((const __m256i*)(pos + j)), p1 = _mm256_loadu_si256((const __m256i*)(pos + j + 4));
        g += store64(idx + g, p0, p1, gk);
        _mm256_storeu_ps(val + h, _mm256_permutevar8x32_ps(value, _mm256_load_si256((const __m256i*)LUT32[hk])));
        h += store64(hit + h, p0, p1, hk);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, mn);
    float best = lanes[0];
    for (int k = 1; k < 8; k++) if (lanes[k] < best) best = lanes[k];
    counts[0] = g; counts[1] = h; counts[2] = nh; counts[3] = nl;
    *cmin = best;
    gate_scalar(pos, d, r, a, j, m, p, idx, d_out, psi_out, def_pos, def_neg, hit, val, counts, cmin);
}
#endif

/* Every output array has room for m + 8 entries. gate: the [B, T] bool map (zeroed), marked at the gated
   positions. */
void sat_gate_fixup(const int64_t* pos, const int32_t* d, const float* r, const float* a, int64_t m, float q,
                    float eh, float el, float hi_base, float lo_base, uint8_t* gate, int64_t* idx, float* d_out,
                    float* psi_out, float* def_pos, float* def_neg, int64_t* hit, float* val, int64_t* counts,
                    float* cmin) {
    sat_params p = {q, eh, el, hi_base, lo_base};
    counts[0] = counts[1] = counts[2] = counts[3] = 0;
    *cmin = __builtin_inff();
#ifdef SAT_X86
    if (use_avx2()) gate_avx2(pos, d, r, a, m, p, idx, d_out, psi_out, def_pos, def_neg, hit, val, counts, cmin);
    else
#endif
        gate_scalar(pos, d, r, a, 0, m, p, idx, d_out, psi_out, def_pos, def_neg, hit, val, counts, cmin);
    for (int64_t j = 0; j < counts[0]; j++) gate[idx[j]] = 1;
}

/* Which code path this build and CPU take: 1 = AVX2, 0 = scalar. The first call builds the lookup tables
   (the loader makes it, before any other). */
int sat_kernel_isa(void) { return use_avx2(); }

/* 1: take the scalar loops even where AVX2 is available (for tests); 0: choose by CPU. */
void sat_force_scalar(int on) { force_scalar = on; }
