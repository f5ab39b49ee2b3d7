/* A complete C consumer: a soft-backend server receives frames through the
 * callback API while `rocev2 fpga-sim` (the FPGA emulator) streams to it over
 * loopback; every frame's sequence number and channel are checked.
 *   stream <path to the rocev2 CLI> [frames] [size]
 * Build: cc -std=c11 stream.c $(pkg-config --cflags --libs rocev2)
 * (or CMake: find_package(rocev2) + rocev2::rocev2; see examples/CMakeLists.txt). */
#define _POSIX_C_SOURCE 200809L
#include <rocev2.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_ulong received, bad;

static void on_frame(void *user, const rocev2_frame *f) {
    uint64_t seq;                                  /* the emulator's pattern: a sequence number first */
    memcpy(&seq, f->data, sizeof seq);             /* zero copy: f->data points into the receive slab */
    if (seq != atomic_load(&received) || f->channel != seq % 4) atomic_fetch_add(&bad, 1);
    atomic_fetch_add(&received, 1);
    rocev2_server_release((rocev2_server *)user, f->token);   /* now or later, from any thread */
}

static int fail(const char *what) {
    char m[512];
    rocev2_last_error(m, sizeof m);
    fprintf(stderr, "stream: %s: %s\n", what, m);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <rocev2 CLI> [frames] [size]\n", argv[0]);
        return 2;
    }
    unsigned long frames = argc > 2 ? strtoul(argv[2], NULL, 0) : 10000;
    unsigned long size = argc > 3 ? strtoul(argv[3], NULL, 0) : 4096;

    rocev2_device_config dc;
    rocev2_device_config_init(&dc, sizeof dc);
    dc.name = "soft";            /* the userspace backend; an RDMA NIC: "mlx5_0" and its dc.gid_index */
    dc.udp_port = 0;             /* any free port (reported in the host params) */
    dc.peer_udp_port = 0;        /* ACKs to each packet's source port (the emulator's) */
    rocev2_device *dev;
    if (rocev2_device_open(&dc, &dev) != ROCEV2_OK) return fail("rocev2_device_open");
    rocev2_server_config sc;
    rocev2_server_config_init(&sc, sizeof sc);
    sc.max_payload = 4096;       /* bytes per receive slot */
    sc.rx_queue_depth = 64;      /* slots */
    rocev2_server *srv;
    if (rocev2_server_create(dev, &sc, &srv) != ROCEV2_OK) return fail("rocev2_server_create");

    uint8_t gid[16];
    rocev2_gid_parse("127.0.0.1", gid);            /* the FPGA's IP address */
    rocev2_server_set_fpga_gid(srv, gid);
    rocev2_host_params hp = {.struct_size = sizeof hp};
    rocev2_server_get_host_params(srv, &hp);       /* program the FPGA with these */
    rocev2_server_register_frame_callback(srv, on_frame, srv);
    uint32_t fpga_qpn = 0x4242;                    /* read back from the FPGA */
    if (rocev2_server_complete_connection(srv, fpga_qpn, hp.sq_psn, 5, 12) != ROCEV2_OK)
        return fail("rocev2_server_complete_connection");

    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' fpga-sim --host 127.0.0.1:%u --host-qpn %u --psn %u --qpn %u --frames %lu --size %lu "
             "--channels 0,1,2,3 >/dev/null",
             argv[1], hp.udp_port, hp.qpn, hp.sq_psn, fpga_qpn, frames, size);
    int emu = system(cmd);                         /* returns once every frame is acknowledged */
    for (int i = 0; i < 1000 && atomic_load(&received) < frames; ++i)   /* an ACK precedes the callback */
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);

    rocev2_stats st = {.struct_size = sizeof st};
    rocev2_server_get_stats(srv, &st);
    rocev2_server_destroy(srv);
    rocev2_device_close(dev);
    printf("stream (C): %lu of %lu frames, %llu bytes, %lu out of order; emulator exit %d\n",
           (unsigned long)atomic_load(&received), frames, (unsigned long long)st.bytes,
           (unsigned long)atomic_load(&bad), emu);
    return emu == 0 && atomic_load(&received) == frames && atomic_load(&bad) == 0 ? 0 : 1;
}
