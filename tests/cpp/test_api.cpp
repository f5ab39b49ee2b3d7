// C++17 tests of rocev2.hpp (the RAII wrapper) against the real library.
#include <rocev2.hpp>

#include <cstdio>
#include <cstring>
#include <string>

static int failures = 0, checks = 0;
#define CHECK(cond)                                                                       \
    do {                                                                                  \
        ++checks;                                                                         \
        if (!(cond)) {                                                                    \
            ++failures;                                                                   \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                                 \
    } while (0)

template <class F>
static rocev2::Error expect_error(F&& f) {
    try {
        f();
    } catch (const rocev2::Error& e) {
        return e;
    }
    ++failures;
    std::fprintf(stderr, "expected rocev2::Error, nothing thrown\n");
    return rocev2::Error(ROCEV2_OK, "");
}

int main() {
    // Device errors carry the status and rogue's texts.
    size_t count = 0;
    char names[256];
    CHECK(rocev2_device_list(names, sizeof names, &count) == ROCEV2_OK);
    auto e = expect_error([] { rocev2::Device d("rocev2-no-such-device"); });
    if (count == 0) {
        CHECK(e.status() == ROCEV2_ERR_NO_DEVICE);
        CHECK(std::string(e.what()) == "No RDMA devices found on this host");
    } else {
        CHECK(e.status() == ROCEV2_ERR_DEVICE_NOT_FOUND);
        CHECK(std::strstr(e.what(), "not found") != nullptr);
    }
    e = expect_error([] { rocev2::Device d("rxe0", 0); });
    CHECK(e.status() == ROCEV2_ERR_INVALID_ARGUMENT);

    // GID helpers round-trip and reject garbage.
    auto g = rocev2::parse_gid("10.0.0.1");
    CHECK(rocev2::format_gid(g) == "0000:0000:0000:0000:0000:ffff:0a00:0001");
    CHECK(rocev2::parse_gid("0000:0000:0000:0000:0000:ffff:0a00:0001") == g);
    e = expect_error([] { rocev2::parse_gid("10.0.0"); });
    CHECK(e.status() == ROCEV2_ERR_INVALID_ARGUMENT);
    CHECK(std::strstr(e.what(), "cannot parse GID") != nullptr);

    // Defaults.
    auto cfg = rocev2::default_server_config();
    CHECK(cfg.max_payload == 9000 && cfg.rx_queue_depth == 256);

    // An empty Frame releases nothing and converts to false.
    rocev2::Frame f;
    CHECK(!f);
    f.release();

    // Link health on a soft server (no peer needed): created, then stopped.
    rocev2_device_config dc;
    CHECK(rocev2_device_config_init(&dc, sizeof dc) == ROCEV2_OK);
    dc.name = "soft";
    dc.udp_port = 0;
    dc.peer_udp_port = 0;
    dc.icrc_check = ROCEV2_ICRC_OFF;
    {
        rocev2::Device dev(dc);
        rocev2::Server srv(dev);
        rocev2_stats st = srv.stats();
        CHECK(st.struct_size == sizeof st && st.link_state == ROCEV2_LINK_CREATED);
        CHECK(st.us_since_last_packet == UINT64_MAX && srv.end_cause().empty());
        srv.stop();
        CHECK(srv.stats().link_state == ROCEV2_LINK_STOPPED);
    }

    // last_error sizes its buffer.
    CHECK(rocev2_server_stop(nullptr) == ROCEV2_ERR_NULL_POINTER);
    CHECK(rocev2::last_error() == "argument `server` is NULL");

    std::printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
