/* A minimal C consumer: a soft-backend server pulling frames with
 * rocev2_server_poll_frame and releasing them at once; prints frames/s. The
 * FPGA is `rocev2 fpga-sim` (started by this program). Used by `./run bench`
 * as the C reference for the Python binding.
 *   consume <rocev2 CLI> <frames> <size> [fpga-sim options...] */
#define _POSIX_C_SOURCE 200809L
#include <rocev2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s <rocev2 CLI> <frames> <size> [fpga-sim options...]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[2]), size = atol(argv[3]);
    rocev2_device_config dc;
    rocev2_device_config_init(&dc, sizeof dc);
    dc.name = "soft";
    dc.udp_port = 0;
    dc.peer_udp_port = 0;
    rocev2_device* dev;
    rocev2_server* srv;
    rocev2_server_config sc;
    rocev2_server_config_init(&sc, sizeof sc);
    sc.max_payload = (uint32_t)size;
    if (rocev2_device_open(&dc, &dev) || rocev2_server_create(dev, &sc, &srv)) {
        char m[256];
        rocev2_last_error(m, sizeof m);
        fprintf(stderr, "consume: %s\n", m);
        return 1;
    }
    uint8_t gid[16];
    rocev2_gid_parse("127.0.0.1", gid);
    rocev2_server_set_fpga_gid(srv, gid);
    rocev2_host_params hp = {.struct_size = sizeof hp};
    rocev2_server_get_host_params(srv, &hp);
    rocev2_server_complete_connection(srv, 0x4242, hp.sq_psn, 5, 1);
    char cmd[1024], extra[512] = "";
    for (int i = 4; i < argc; ++i) {  // e.g. --window 256 --gso
        size_t at = strlen(extra);
        snprintf(extra + at, sizeof extra - at, " %s", argv[i]);
    }
    snprintf(cmd, sizeof cmd,
             "%s fpga-sim --host 127.0.0.1:%u --host-qpn %u --psn %u --qpn 0x4242 --frames %ld --size %ld%s "
             ">/dev/null 2>&1 &",
             argv[1], hp.udp_port, hp.qpn, hp.sq_psn, n, size, extra);
    if (system(cmd) != 0) return 1;
    struct timespec t0, t1;
    rocev2_frame f = {.struct_size = sizeof f};
    long got = 0;
    if (rocev2_server_poll_frame(srv, 10000, &f) == ROCEV2_OK) {  // the clock starts at the first frame
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rocev2_server_release(srv, f.token);
        got = 1;
    }
    while (got < n && rocev2_server_poll_frame(srv, 10000, &f) == ROCEV2_OK) {
        rocev2_server_release(srv, f.token);
        ++got;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%.0f\n", got > 1 ? (got - 1) / s : 0.0);
    rocev2_server_destroy(srv);
    rocev2_device_close(dev);
    return got == n ? 0 : 1;
}
