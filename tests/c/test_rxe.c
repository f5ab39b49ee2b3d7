/* The verbs backend through the C API on the kernel's Soft-RoCE, inside the
 * rxe VM (tests/vm/run.sh): a server on rxe0, `rocev2 verbs-fpga` on rxe1 as
 * the FPGA. Every frame arrives once, in order, byte-exact, on the right
 * channel with the right immediate; counters match.
 * Usage: test_rxe_c <path to the rocev2 CLI> (needs RXE0_GID_IDX, RXE1_GID_IDX) */
#define _DEFAULT_SOURCE
#include <rocev2.h>

#include "check.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>



struct st {
    rocev2_server* srv;
    atomic_ullong next;
    atomic_int errors;
};

static void on_frame(void* user, const rocev2_frame* f) {
    struct st* s = user;
    uint64_t seq = 0, want = atomic_fetch_add(&s->next, 1);
    if (!pattern_check(f->data, f->len, &seq) || seq != want || f->channel != seq % 3 ||
        (f->immediate >> 8) != (uint32_t)seq)
        atomic_fetch_add(&s->errors, 1);
    rocev2_server_release(s->srv, f->token);
}

static unsigned long field(const char* json, const char* key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char* p = strstr(json, k);
    return p ? strtoul(p + strlen(k), NULL, 10) : 0;
}

int main(int argc, char** argv) {
    if (argc < 2 || !getenv("RXE0_GID_IDX") || !getenv("RXE1_GID_IDX")) {
        fprintf(stderr, "usage: %s <rocev2 CLI>, inside the rxe VM\n", argv[0]);
        return 2;
    }
    rocev2_device_config dc;
    rocev2_device_config_init(&dc, sizeof dc);
    dc.name = "rxe0";
    dc.gid_index = (uint8_t)atoi(getenv("RXE0_GID_IDX"));
    rocev2_device* dev = NULL;
    CHECK_OK(rocev2_device_open(&dc, &dev));
    rocev2_server_config sc;
    rocev2_server_config_init(&sc, sizeof sc);
    sc.max_payload = 4096;
    sc.rx_queue_depth = 64;
    rocev2_server* srv = NULL;
    CHECK_OK(rocev2_server_create(dev, &sc, &srv));
    if (!srv) return 1;
    rocev2_host_params hp = {.struct_size = sizeof hp};
    CHECK_OK(rocev2_server_get_host_params(srv, &hp));
    static struct st st;
    st.srv = srv;
    CHECK_OK(rocev2_server_register_frame_callback(srv, on_frame, &st));

    /* The FPGA: rocev2 verbs-fpga on rxe1, talking over pipes. */
    int to_child[2], from_child[2];
    CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
    char qpn[32], psn[32];
    snprintf(qpn, sizeof qpn, "%u", hp.qpn);
    snprintf(psn, sizeof psn, "%u", hp.sq_psn);
    const int N = 1500;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        execl(argv[1], argv[1], "verbs-fpga", "--device", "rxe1", "--gid-index", getenv("RXE1_GID_IDX"),
              "--host-qpn", qpn, "--host-gid", hp.gid_str, "--psn", psn, "--frames", "1500", "--size", "4096",
              "--channels", "0,1,2", (char*)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    FILE* in = fdopen(from_child[0], "r");
    char line[512] = {0};
    CHECK(fgets(line, sizeof line, in) != NULL);
    unsigned long fpga_qpn = field(line, "qpn");
    CHECK(fpga_qpn != 0);
    uint8_t fgid[16];
    const char* g = strstr(line, "\"gid\": \"");
    char gid_text[64] = {0};
    if (g) sscanf(g + 8, "%39[0-9a-f:]", gid_text);
    CHECK_OK(rocev2_gid_parse(gid_text, fgid));
    CHECK_OK(rocev2_server_set_fpga_gid(srv, fgid));
    CHECK_OK(rocev2_server_complete_connection(srv, (uint32_t)fpga_qpn, hp.sq_psn, 5, 1));
    CHECK(write(to_child[1], "go\n", 3) == 3);
    char summary[512] = {0};
    CHECK(fgets(summary, sizeof summary, in) != NULL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (int i = 0; i < 30000 && atomic_load(&st.next) < (unsigned long long)N; ++i) usleep(1000);
    CHECK(atomic_load(&st.next) == (unsigned long long)N);
    CHECK(atomic_load(&st.errors) == 0);
    rocev2_stats s = {.struct_size = sizeof s};
    s.struct_size = sizeof s;
    CHECK_OK(rocev2_server_get_stats(srv, &s));
    CHECK(s.frames == (uint64_t)N && s.bytes == (uint64_t)N * 4096 && s.completion_errors == 0);
    printf("RXE-RATE C API verbs e2e: %s", summary);
    rocev2_server_destroy(srv);
    rocev2_device_close(dev);
    return report();
}
