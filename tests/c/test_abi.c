/* ABI 2's size protocol, played by callers compiled against other versions
 * of rocev2.h (run under AddressSanitizer by the ASan ctest build):
 * - an older caller: structs cut short, inside buffers with canary bytes
 *   around them: the library writes at most struct_size bytes, never past;
 * - a newer caller: a longer struct, its unknown tail zero (accepted, the
 *   known fields used), then non-zero (refused, naming the byte). */
#include "check.h"

#include <stddef.h>
#include <string.h>

#define CANARY 0xA5

static char msg[512];
static const char* last(void) {
    rocev2_last_error(msg, sizeof msg);
    return msg;
}

/* `len` bytes of `buf` from `from` on still hold the canary. */
static int canary_intact(const unsigned char* buf, size_t from, size_t len) {
    for (size_t i = from; i < len; ++i)
        if (buf[i] != CANARY) return 0;
    return 1;
}

static rocev2_device* soft_device(void) {
    rocev2_device_config dc;
    CHECK_OK(rocev2_device_config_init(&dc, sizeof dc));
    dc.name = "soft";
    dc.bind_addr = "127.0.0.1";
    dc.udp_port = 0;
    dc.peer_udp_port = 0;
    dc.icrc_check = ROCEV2_ICRC_OFF;
    rocev2_device* dev = NULL;
    CHECK_OK(rocev2_device_open(&dc, &dev));
    return dev;
}

static void older_caller_init_writes_only_its_size(void) {
    unsigned char buf[sizeof(rocev2_server_config) + 32];
    size_t cut = offsetof(rocev2_server_config, spin_us);
    memset(buf, CANARY, sizeof buf);
    CHECK_OK(rocev2_server_config_init((rocev2_server_config*)buf, cut));
    CHECK(canary_intact(buf, cut, sizeof buf));
    rocev2_server_config* sc = (rocev2_server_config*)buf;
    CHECK(sc->struct_size == cut && sc->max_payload == ROCEV2_DEFAULT_MAX_PAYLOAD);
    /* Shorter than ABI 2's first struct: refused with what to do. */
    rocev2_server* srv = NULL;
    CHECK(rocev2_server_create(NULL, sc, &srv) == ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "rocev2_server_config_init") != NULL);
    CHECK(rocev2_server_config_init((rocev2_server_config*)buf, 2) == ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(canary_intact(buf, cut, sizeof buf));
    /* A 2.2 caller (before measure_latency / busy_poll_us) is accepted, the
     * new fields at their defaults. */
    size_t s22 = offsetof(rocev2_server_config, measure_latency);
    CHECK_OK(rocev2_server_config_init((rocev2_server_config*)buf, s22));
    CHECK_OK(rocev2_server_config_check(sc));
    rocev2_device_config dc;
    CHECK_OK(rocev2_device_config_init(&dc, sizeof dc));
    CHECK(dc.busy_poll_us == 0);
    dc.struct_size = (uint32_t)offsetof(rocev2_device_config, busy_poll_us);
    dc.name = "soft";
    dc.udp_port = 0;
    rocev2_device* dev = NULL;
    CHECK_OK(rocev2_device_open(&dc, &dev));
    rocev2_device_close(dev);
    /* measure_latency is a flag: 0 or 1. */
    rocev2_server_config bad;
    CHECK_OK(rocev2_server_config_init(&bad, sizeof bad));
    bad.measure_latency = 2;
    CHECK(rocev2_server_config_check(&bad) == ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "measure_latency") != NULL);
    /* A 2.3 caller (before counter_wrap) is accepted, the check off. */
    memset(buf, CANARY, sizeof buf);
    size_t s23 = offsetof(rocev2_server_config, counter_wrap);
    CHECK_OK(rocev2_server_config_init((rocev2_server_config*)buf, s23));
    CHECK(canary_intact(buf, s23, sizeof buf));
    CHECK_OK(rocev2_server_config_check(sc));
    CHECK_OK(rocev2_server_config_init(&bad, sizeof bad));
    CHECK(bad.counter_wrap == 0);
    bad.counter_wrap = (1u << 24) + 1; /* the FPGA's counter is 24 bits */
    CHECK(rocev2_server_config_check(&bad) == ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "counterWrap") != NULL);
    bad.counter_wrap = 1u << 24;
    CHECK_OK(rocev2_server_config_check(&bad));
}

static void older_caller_output_structs_cut_short(rocev2_server* srv) {
    /* Host params: a caller that knows only up to mr_len. */
    unsigned char hb[sizeof(rocev2_host_params) + 32];
    memset(hb, CANARY, sizeof hb);
    size_t cut = offsetof(rocev2_host_params, mr_addr);
    ((rocev2_host_params*)hb)->struct_size = (uint32_t)cut;
    CHECK_OK(rocev2_server_get_host_params(srv, (rocev2_host_params*)hb));
    CHECK(((rocev2_host_params*)hb)->struct_size == cut);
    CHECK(((rocev2_host_params*)hb)->qpn > 1);
    CHECK(canary_intact(hb, cut, sizeof hb));
    /* The whole struct: written whole, nothing past it. */
    ((rocev2_host_params*)hb)->struct_size = sizeof(rocev2_host_params);
    CHECK_OK(rocev2_server_get_host_params(srv, (rocev2_host_params*)hb));
    CHECK(((rocev2_host_params*)hb)->struct_size == sizeof(rocev2_host_params));
    CHECK(canary_intact(hb, sizeof(rocev2_host_params), sizeof hb));
    /* A newer caller's larger struct: we write what we know. */
    ((rocev2_host_params*)hb)->struct_size = sizeof hb;
    CHECK_OK(rocev2_server_get_host_params(srv, (rocev2_host_params*)hb));
    CHECK(((rocev2_host_params*)hb)->struct_size == sizeof(rocev2_host_params));

    /* Stats cut to 3 counters. */
    unsigned char sb[sizeof(rocev2_stats) + 32];
    memset(sb, CANARY, sizeof sb);
    size_t scut = offsetof(rocev2_stats, releases);
    ((rocev2_stats*)sb)->struct_size = (uint32_t)scut;
    CHECK_OK(rocev2_server_get_stats(srv, (rocev2_stats*)sb));
    CHECK(((rocev2_stats*)sb)->struct_size == scut && ((rocev2_stats*)sb)->frames == 0);
    CHECK(canary_intact(sb, scut, sizeof sb));
    ((rocev2_stats*)sb)->struct_size = 2;
    CHECK(rocev2_server_get_stats(srv, (rocev2_stats*)sb) == ROCEV2_ERR_INVALID_ARGUMENT);

    /* A frame too short for its token: refused before any frame is taken. */
    unsigned char fb[sizeof(rocev2_frame) + 32];
    memset(fb, CANARY, sizeof fb);
    size_t fcut = offsetof(rocev2_frame, token);
    ((rocev2_frame*)fb)->struct_size = (uint32_t)fcut;
    CHECK(rocev2_server_poll_frame(srv, 0, (rocev2_frame*)fb) == ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "sizeof(rocev2_frame)") != NULL);
    CHECK(canary_intact(fb, 4, sizeof fb));
}

/* What a caller built against a future rocev2.h with one more field sees. */
typedef struct {
    rocev2_server_config base;
    uint32_t future_field;
    uint32_t future_pad;
} newer_server_config;

typedef struct {
    rocev2_device_config base;
    uint64_t future_field;
} newer_device_config;

static void newer_caller_zero_tail_accepted_nonzero_refused(rocev2_device* dev) {
    newer_server_config n;
    memset(&n, CANARY, sizeof n);
    CHECK_OK(rocev2_server_config_init(&n.base, sizeof n));
    CHECK(n.base.struct_size == sizeof n && n.future_field == 0 && n.future_pad == 0);
    n.base.max_payload = 1024;
    n.base.rx_queue_depth = 4;
    rocev2_server* srv = NULL;
    CHECK_OK(rocev2_server_create(dev, &n.base, &srv));
    rocev2_host_params hp = {.struct_size = sizeof hp};
    CHECK_OK(rocev2_server_get_host_params(srv, &hp));
    CHECK(hp.mr_len == 4 * 1024); /* the known fields were used */
    rocev2_server_destroy(srv);
    n.future_field = 7;
    srv = NULL;
    CHECK(rocev2_server_create(dev, &n.base, &srv) == ROCEV2_ERR_INVALID_ARGUMENT && srv == NULL);
    CHECK(strstr(last(), "upgrade librocev2") != NULL);

    newer_device_config d;
    CHECK_OK(rocev2_device_config_init(&d.base, sizeof d));
    CHECK(d.base.struct_size == sizeof d && d.future_field == 0 && d.base.ib_port == 1);
    d.base.name = "soft";
    d.base.udp_port = 0;
    d.base.peer_udp_port = 0;
    d.base.icrc_check = ROCEV2_ICRC_OFF;
    rocev2_device* dev2 = NULL;
    CHECK_OK(rocev2_device_open(&d.base, &dev2));
    rocev2_device_close(dev2);
    d.future_field = 1;
    dev2 = NULL;
    CHECK(rocev2_device_open(&d.base, &dev2) == ROCEV2_ERR_INVALID_ARGUMENT && dev2 == NULL);
    CHECK(strstr(last(), "is not zero") != NULL);
}

/* What a binding that declares the structs itself checks at load. */
static void struct_sizes_and_code_tables(void) {
    CHECK(rocev2_struct_size(ROCEV2_STRUCT_DEVICE_CONFIG) == sizeof(rocev2_device_config));
    CHECK(rocev2_struct_size(ROCEV2_STRUCT_SERVER_CONFIG) == sizeof(rocev2_server_config));
    CHECK(rocev2_struct_size(ROCEV2_STRUCT_HOST_PARAMS) == sizeof(rocev2_host_params));
    CHECK(rocev2_struct_size(ROCEV2_STRUCT_FRAME) == sizeof(rocev2_frame));
    CHECK(rocev2_struct_size(ROCEV2_STRUCT_STATS) == sizeof(rocev2_stats));
    CHECK(rocev2_struct_size(0) == 0);
    uint32_t v = 0;
    CHECK_OK(rocev2_pmtu_bytes(3, &v));
    CHECK(v == 1024);
    CHECK(rocev2_pmtu_bytes(0, &v) == ROCEV2_ERR_INVALID_ARGUMENT && strstr(last(), "got 0"));
    CHECK_OK(rocev2_rnr_timer_us(12, &v));
    CHECK(v == 640);
    rocev2_server_config sc;
    CHECK_OK(rocev2_server_config_init(&sc, sizeof sc));
    CHECK_OK(rocev2_server_config_check(&sc));
    sc.max_payload = 65536;
    sc.rx_queue_depth = 65536;
    CHECK(rocev2_server_config_check(&sc) == ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "exceeds 4 GiB") != NULL);
}

/* ABI 2.1 grew rocev2_stats (link health): a 2.0 caller's struct ends
 * before link_state and gets exactly that much; 2.2 added naps. */
static void stats_grew_in_2_1(rocev2_server* srv) {
    unsigned char sb[sizeof(rocev2_stats) + 16];
    size_t v20 = offsetof(rocev2_stats, link_state);
    memset(sb, 0xA5, sizeof sb);
    ((rocev2_stats*)sb)->struct_size = (uint32_t)v20;
    CHECK_OK(rocev2_server_get_stats(srv, (rocev2_stats*)sb));
    CHECK(((rocev2_stats*)sb)->struct_size == v20);
    CHECK(canary_intact(sb, v20, sizeof sb));
    rocev2_stats st;
    st.struct_size = sizeof st;
    CHECK_OK(rocev2_server_get_stats(srv, &st));
    CHECK(st.struct_size == sizeof st && st.link_state == ROCEV2_LINK_CREATED);
    CHECK(st.us_since_last_packet == UINT64_MAX && st.us_since_last_frame == UINT64_MAX);
    CHECK(st.peer_restarts == 0 && st.stale_packets == 0 && st.reserved2 == 0);
    CHECK(st.naps == 0);
    /* ABI 2.2 grew it again (naps): a 2.1 caller's struct ends before it. */
    size_t v21 = offsetof(rocev2_stats, naps);
    memset(sb, 0xA5, sizeof sb);
    ((rocev2_stats*)sb)->struct_size = (uint32_t)v21;
    CHECK_OK(rocev2_server_get_stats(srv, (rocev2_stats*)sb));
    CHECK(((rocev2_stats*)sb)->struct_size == v21);
    CHECK(((rocev2_stats*)sb)->peer_restarts == 0);
    CHECK(canary_intact(sb, v21, sizeof sb));
    /* ABI 2.3 grew it again (latency): a 2.2 caller's struct ends before it. */
    size_t v22 = offsetof(rocev2_stats, lost_frames_estimate);
    memset(sb, 0xA5, sizeof sb);
    ((rocev2_stats*)sb)->struct_size = (uint32_t)v22;
    CHECK_OK(rocev2_server_get_stats(srv, (rocev2_stats*)sb));
    CHECK(((rocev2_stats*)sb)->struct_size == v22 && ((rocev2_stats*)sb)->naps == 0);
    CHECK(canary_intact(sb, v22, sizeof sb));
    /* ABI 2.4 grew it again (counter check, verdicts): a 2.3 caller's
     * struct ends before it. */
    size_t v23 = offsetof(rocev2_stats, counter_gaps);
    memset(sb, 0xA5, sizeof sb);
    ((rocev2_stats*)sb)->struct_size = (uint32_t)v23;
    CHECK_OK(rocev2_server_get_stats(srv, (rocev2_stats*)sb));
    CHECK(((rocev2_stats*)sb)->struct_size == v23 && ((rocev2_stats*)sb)->delivery_max_ns == 0);
    CHECK(canary_intact(sb, v23, sizeof sb));
    CHECK(st.counter_gaps == 0 && st.counter_gap_frames == 0 && st.counter_resets == 0);
    CHECK(st.ack_turnaround_count == 0 && st.delivery_count == 0); /* not measured */
    CHECK(rocev2_server_end_cause(srv, NULL, 0) == 0); /* created: nothing ended */
    char cause[8] = "x";
    CHECK(rocev2_server_end_cause(NULL, cause, sizeof cause) == 0);
    /* The batch pull checks its arguments before taking any frame. */
    rocev2_frame fr[4];
    size_t got = 99;
    fr[0].struct_size = 4;
    CHECK(rocev2_server_poll_frames(srv, 0, fr, 4, &got) == ROCEV2_ERR_INVALID_ARGUMENT && got == 0);
    /* A 2.3 caller's frame (before rx_time_ns) is accepted; shorter is not. */
    fr[0].struct_size = (uint32_t)offsetof(rocev2_frame, rx_time_ns);
    CHECK(rocev2_server_poll_frames(srv, 0, fr, 4, &got) == ROCEV2_ERR_TIMEOUT && got == 0);
    CHECK(rocev2_server_poll_frame(srv, 0, fr) == ROCEV2_ERR_TIMEOUT);
    fr[0].struct_size = (uint32_t)offsetof(rocev2_frame, rx_time_ns) - 1;
    CHECK(rocev2_server_poll_frame(srv, 0, fr) == ROCEV2_ERR_INVALID_ARGUMENT);
    fr[0].struct_size = sizeof fr[0];
    CHECK(rocev2_server_poll_frames(srv, 0, fr, 0, &got) == ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(rocev2_server_poll_frames(srv, 0, fr, 4, NULL) == ROCEV2_ERR_NULL_POINTER);
    CHECK(rocev2_server_poll_frames(srv, 0, NULL, 4, &got) == ROCEV2_ERR_NULL_POINTER);
    CHECK(rocev2_server_release_many(srv, NULL, 0) == ROCEV2_OK);
    CHECK(rocev2_server_release_many(srv, NULL, 2) == ROCEV2_ERR_NULL_POINTER);
    uint64_t bogus[2] = {0, 7};
    CHECK(rocev2_server_release_many(srv, bogus, 2) == ROCEV2_ERR_UNKNOWN_TOKEN);
    CHECK(strstr(last(), "tokens[0]") != NULL);
}

int main(void) {
    CHECK(rocev2_abi_version() == ROCEV2_ABI_VERSION && ROCEV2_ABI_VERSION == 2);
    struct_sizes_and_code_tables();
    older_caller_init_writes_only_its_size();
    rocev2_device* dev = soft_device();
    rocev2_server_config sc;
    CHECK_OK(rocev2_server_config_init(&sc, sizeof sc));
    sc.max_payload = 1024;
    sc.rx_queue_depth = 4;
    rocev2_server* srv = NULL;
    CHECK_OK(rocev2_server_create(dev, &sc, &srv));
    older_caller_output_structs_cut_short(srv);
    newer_caller_zero_tail_accepted_nonzero_refused(dev);
    stats_grew_in_2_1(srv);
    rocev2_server_destroy(srv);
    rocev2_device_close(dev);
    printf("c_abi: %d checks, %d failures\n", checks, failures);
    return failures != 0;
}
