/* C11 tests of librocev2's C API error paths, against the real library.
 * On a host without RDMA devices (CI) device opens fail with
 * ROCEV2_ERR_NO_DEVICE; on a host with devices (the rxe VM) an unknown name
 * fails with ROCEV2_ERR_DEVICE_NOT_FOUND. Everything else is host-independent. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <rocev2.h>

#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static char msg[512];
static const char* last(void) {
    rocev2_last_error(msg, sizeof msg);
    return msg;
}
#define CHECK_STATUS(call, want) CHECK((call) == (want))
#define CHECK_MSG(sub) CHECK(strstr(last(), (sub)) != NULL)

static int log_records = 0;
static char log_last[512];
static void on_log(void* user, rocev2_log_level level, const char* target, const char* message) {
    (void)level;
    (void)target;
    ++*(int*)user;
    snprintf(log_last, sizeof log_last, "%s", message);
}

static void test_library(void) {
    CHECK(rocev2_abi_version() == ROCEV2_ABI_VERSION);
    CHECK(strlen(rocev2_version()) >= 5);
    CHECK(strcmp(rocev2_status_str(ROCEV2_OK), "ok") == 0);
    CHECK(strcmp(rocev2_status_str(ROCEV2_ERR_NO_DEVICE), "no RDMA device") == 0);
    CHECK(strcmp(rocev2_status_str(12345), "unknown status") == 0);
    CHECK(strcmp(rocev2_status_str(-1), "unknown status") == 0);
}

static void test_last_error_buffer(void) {
    CHECK_STATUS(rocev2_device_open(NULL, NULL), ROCEV2_ERR_NULL_POINTER);
    size_t full = rocev2_last_error(NULL, 0);
    CHECK(full == strlen("argument `out` is NULL"));
    char small[8];
    memset(small, 'x', sizeof small);
    CHECK(rocev2_last_error(small, sizeof small) == full);
    CHECK(small[7] == '\0' && strncmp(small, "argumen", 7) == 0);
    CHECK_MSG("argument `out` is NULL");
}

static void test_device_errors(void) {
    rocev2_device_config cfg;
    rocev2_device* dev = (rocev2_device*)0x1;
    CHECK_STATUS(rocev2_device_config_init(NULL, sizeof(rocev2_device_config)), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_device_config_init(&cfg, sizeof cfg), ROCEV2_OK);
    CHECK(cfg.struct_size == sizeof cfg && cfg.ib_port == 1 && cfg.gid_index == 0 && cfg.udp_port == 4791);

    CHECK_STATUS(rocev2_device_open(&cfg, NULL), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_device_open(NULL, &dev), ROCEV2_ERR_NULL_POINTER);
    CHECK(dev == NULL);
    CHECK_MSG("`cfg`");
    CHECK_STATUS(rocev2_device_open(&cfg, &dev), ROCEV2_ERR_NULL_POINTER); /* name NULL */
    CHECK_MSG("cfg->name");

    rocev2_device_config bad = cfg;
    bad.struct_size = 4;
    bad.name = "rxe0";
    CHECK_STATUS(rocev2_device_open(&bad, &dev), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("rocev2_device_config_init");

    cfg.name = "";
    CHECK_STATUS(rocev2_device_open(&cfg, &dev), ROCEV2_ERR_INVALID_ARGUMENT);
    cfg.name = "rxe0";
    cfg.ib_port = 0;
    CHECK_STATUS(rocev2_device_open(&cfg, &dev), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("ib_port");
    cfg.ib_port = 1;

    char names[256];
    size_t count = 99;
    CHECK_STATUS(rocev2_device_list(names, sizeof names, NULL), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_device_list(names, sizeof names, &count), ROCEV2_OK);
    cfg.name = "rocev2-no-such-device";
    rocev2_status s = rocev2_device_open(&cfg, &dev);
    if (count == 0) {
        CHECK(s == ROCEV2_ERR_NO_DEVICE);
        CHECK(strcmp(last(), "No RDMA devices found on this host") == 0);
    } else {
        CHECK(s == ROCEV2_ERR_DEVICE_NOT_FOUND);
        CHECK_MSG("RDMA device 'rocev2-no-such-device' not found");
    }
    CHECK(dev == NULL);
    rocev2_device_close(NULL); /* ignored */
}

static void test_server_errors(void) {
    rocev2_server_config sc;
    rocev2_server* srv = (rocev2_server*)0x1;
    CHECK_STATUS(rocev2_server_config_init(NULL, sizeof(rocev2_server_config)), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_config_init(&sc, sizeof sc), ROCEV2_OK);
    CHECK(sc.struct_size == sizeof sc && sc.max_payload == ROCEV2_DEFAULT_MAX_PAYLOAD &&
          sc.rx_queue_depth == ROCEV2_DEFAULT_RX_QUEUE_DEPTH && sc.cpu_affinity == -1);

    CHECK_STATUS(rocev2_server_create(NULL, &sc, NULL), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_create(NULL, &sc, &srv), ROCEV2_ERR_NULL_POINTER);
    CHECK(srv == NULL);
    CHECK_MSG("`dev`");

    /* Sizes are validated before the device handle. */
    rocev2_server_config big = sc;
    big.max_payload = 65536;
    big.rx_queue_depth = 65536;
    CHECK_STATUS(rocev2_server_create(NULL, &big, &srv), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("RX slab too large: 65536 * 65536 = 4294967296 exceeds 4 GiB");
    big = sc;
    big.rx_queue_depth = 0;
    CHECK_STATUS(rocev2_server_create(NULL, &big, &srv), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("rxQueueDepth must be in the range");
    big = sc;
    big.max_payload = 0;
    CHECK_STATUS(rocev2_server_create(NULL, &big, &srv), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("maxPayload");
    big = sc;
    big.cpu_affinity = -7;
    CHECK_STATUS(rocev2_server_create(NULL, &big, &srv), ROCEV2_ERR_INVALID_ARGUMENT);
    big = sc;
    big.struct_size = 0;
    CHECK_STATUS(rocev2_server_create(NULL, &big, &srv), ROCEV2_ERR_INVALID_ARGUMENT);

    /* Connection parameters are validated before the server handle. */
    CHECK_STATUS(rocev2_server_complete_connection(NULL, 1, 0, 0, 1), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(last(), "pmtu must be in the range 1..5 (1=256 2=512 3=1024 4=2048 5=4096); got 0") == 0);
    CHECK_STATUS(rocev2_server_complete_connection(NULL, 1, 0, 6, 1), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("got 6");
    CHECK_STATUS(rocev2_server_complete_connection(NULL, 1, 0, 5, 32), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("minRnrTimer must be an IB RNR timer code 0..31");
    CHECK_STATUS(rocev2_server_complete_connection(NULL, 0x1000000, 0, 5, 1), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("fpgaQpn");
    CHECK_STATUS(rocev2_server_complete_connection(NULL, 1, 0x1000000, 5, 1), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("fpgaRqPsn");
    CHECK_STATUS(rocev2_server_complete_connection(NULL, 1, 0, 5, 1), ROCEV2_ERR_NULL_POINTER);

    /* Every server function checks its handle. */
    uint8_t gid[16] = {0};
    rocev2_host_params hp = {.struct_size = sizeof hp};
    rocev2_frame fr = {.struct_size = sizeof fr};
    rocev2_stats st = {.struct_size = sizeof st};
    st.struct_size = sizeof st;
    CHECK_STATUS(rocev2_server_set_fpga_gid(NULL, gid), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_get_host_params(NULL, &hp), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_register_frame_callback(NULL, NULL, NULL), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_poll_frame(NULL, 0, &fr), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_poll_frame(NULL, 0, NULL), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_release(NULL, 1), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_get_stats(NULL, &st), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_server_stop(NULL), ROCEV2_ERR_NULL_POINTER);
    CHECK(rocev2_server_is_running(NULL) == 0);
    rocev2_server_destroy(NULL); /* ignored */
}

static void test_gid_helpers(void) {
    uint8_t gid[16];
    char text[40];
    CHECK_STATUS(rocev2_gid_parse("10.0.0.1", gid), ROCEV2_OK);
    CHECK(gid[10] == 0xff && gid[11] == 0xff && gid[12] == 10 && gid[15] == 1);
    CHECK_STATUS(rocev2_gid_format(gid, text, sizeof text), ROCEV2_OK);
    CHECK(strcmp(text, "0000:0000:0000:0000:0000:ffff:0a00:0001") == 0);
    CHECK_STATUS(rocev2_gid_parse("::ffff:192.168.1.100", gid), ROCEV2_OK);
    CHECK_STATUS(rocev2_gid_format(gid, text, sizeof text), ROCEV2_OK);
    CHECK(strcmp(text, "0000:0000:0000:0000:0000:ffff:c0a8:0164") == 0);
    CHECK_STATUS(rocev2_gid_format(gid, text, 39), ROCEV2_ERR_BUFFER_TOO_SMALL);
    CHECK_STATUS(rocev2_gid_parse("not a gid", gid), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_MSG("cannot parse GID");
    CHECK_STATUS(rocev2_gid_parse(NULL, gid), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_gid_parse("10.0.0.1", NULL), ROCEV2_ERR_NULL_POINTER);
}

static void put(const char* path, const char* text) {
    FILE* f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
}

static void test_detect_gid_index(void) {
    char root[] = "/tmp/rocev2-c-sysfs-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char p[512];
    const char* dirs[] = {"/class", "/class/infiniband", "/class/infiniband/mlx5_0",
                          "/class/infiniband/mlx5_0/ports", "/class/infiniband/mlx5_0/ports/1",
                          "/class/infiniband/mlx5_0/ports/1/gids",
                          "/class/infiniband/mlx5_0/ports/1/gid_attrs",
                          "/class/infiniband/mlx5_0/ports/1/gid_attrs/types"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; ++i) {
        snprintf(p, sizeof p, "%s%s", root, dirs[i]);
        mkdir(p, 0755);
    }
    const char* base = "/class/infiniband/mlx5_0/ports/1";
    snprintf(p, sizeof p, "%s%s/gid_attrs/types/2", root, base);
    put(p, "IB/RoCE v1\n");
    snprintf(p, sizeof p, "%s%s/gids/2", root, base);
    put(p, "0000:0000:0000:0000:0000:ffff:0a00:0001\n");
    snprintf(p, sizeof p, "%s%s/gid_attrs/types/3", root, base);
    put(p, "RoCE v2\n");
    snprintf(p, sizeof p, "%s%s/gids/3", root, base);
    put(p, "0000:0000:0000:0000:0000:ffff:0a00:0001\n");

    uint32_t idx = 0;
    CHECK_STATUS(rocev2_gid_detect_index("mlx5_0", "10.0.0.20", 1, root, &idx), ROCEV2_OK);
    CHECK(idx == 3);
    CHECK_STATUS(rocev2_gid_detect_index("mlx5_0", "172.16.0.1", 1, root, &idx), ROCEV2_ERR_NOT_FOUND);
    CHECK_MSG("could not auto-detect a RoCE v2 IPv4 GID on mlx5_0");
    CHECK_STATUS(rocev2_gid_detect_index("mlx5_0", "bogus", 1, root, &idx), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rocev2_gid_detect_index(NULL, "10.0.0.1", 1, root, &idx), ROCEV2_ERR_NULL_POINTER);
    CHECK_STATUS(rocev2_gid_detect_index("mlx5_0", "10.0.0.1", 1, root, NULL), ROCEV2_ERR_NULL_POINTER);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

static void test_log_callback(void) {
    CHECK_STATUS(rocev2_set_log_callback(on_log, &log_records, 9), ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rocev2_set_log_callback(on_log, &log_records, ROCEV2_LOG_DEBUG), ROCEV2_OK);
    rocev2_gid_parse("nonsense", (uint8_t[16]){0});
    CHECK(log_records >= 1);
    CHECK(strstr(log_last, "rocev2_gid_parse failed: cannot parse GID") != NULL);
    int before = log_records;
    CHECK_STATUS(rocev2_set_log_callback(NULL, NULL, ROCEV2_LOG_OFF), ROCEV2_OK);
    rocev2_gid_parse("nonsense", (uint8_t[16]){0});
    CHECK(log_records == before);
}

int main(void) {
    test_library();
    test_last_error_buffer();
    test_device_errors();
    test_server_errors();
    test_gid_helpers();
    test_detect_gid_index();
    test_log_callback();
    return report();
}
