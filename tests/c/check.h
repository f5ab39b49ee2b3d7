/* Shared by the C tests: CHECK / CHECK_OK counters and the FPGA emulator's
 * payload pattern (src/soft/pattern.rs), written out in C. */
#ifndef ROCEV2_TESTS_CHECK_H
#define ROCEV2_TESTS_CHECK_H

#include <rocev2.h>

#include <stdint.h>
#include <stdio.h>

static int failures = 0, checks = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        ++checks;                                                                    \
        if (!(cond)) {                                                               \
            ++failures;                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define CHECK_OK(call)                                                                   \
    do {                                                                                 \
        rocev2_status s_ = (call);                                                       \
        ++checks;                                                                        \
        if (s_ != ROCEV2_OK) {                                                           \
            char m_[512];                                                                \
            rocev2_last_error(m_, sizeof m_);                                            \
            ++failures;                                                                  \
            fprintf(stderr, "%s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #call, s_, m_); \
        }                                                                                \
    } while (0)

/* 1 when `d` holds the emulator's pattern (bytes 0..8: sequence number,
 * little-endian; then xorshift32 seeded from it); its sequence number in *seq_out. */
static inline int pattern_check(const uint8_t* d, uint32_t len, uint64_t* seq_out) {
    if (len < 8) return 0;
    uint64_t seq = 0;
    for (int i = 7; i >= 0; --i) seq = (seq << 8) | d[i];
    uint32_t s = (uint32_t)((seq * 0x9E3779B97F4A7C15ull) >> 32) | 1u;
    for (uint32_t at = 8; at < len; at += 4) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        for (uint32_t k = 0; k < 4 && at + k < len; ++k)
            if (d[at + k] != (uint8_t)(s >> (8 * k))) return 0;
    }
    *seq_out = seq;
    return 1;
}

static inline int report(void) {
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}

#endif
