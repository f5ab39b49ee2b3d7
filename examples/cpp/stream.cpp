// A complete C++17 consumer (include/rocev2.hpp, RAII): a soft-backend server
// pulls frames on this thread while `rocev2 fpga-sim` (the FPGA emulator)
// streams to it over loopback; every frame's sequence number and channel are
// checked.
//   stream_cpp <path to the rocev2 CLI> [frames] [size]
#include <rocev2.hpp>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

int main(int argc, char** argv) try {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s <rocev2 CLI> [frames] [size]\n", argv[0]);
        return 2;
    }
    unsigned long frames = argc > 2 ? std::stoul(argv[2]) : 10000, size = argc > 3 ? std::stoul(argv[3]) : 4096;

    rocev2_device_config dc;
    rocev2_device_config_init(&dc, sizeof dc);
    dc.name = "soft";       // the userspace backend; an RDMA NIC: rocev2::Device("mlx5_0", 1, gid_index)
    dc.udp_port = 0;        // any free port (reported in the host params)
    dc.peer_udp_port = 0;   // ACKs to each packet's source port (the emulator's)
    rocev2::Device dev(dc);
    rocev2_server_config sc = rocev2::default_server_config();
    sc.max_payload = 4096;
    sc.rx_queue_depth = 64;
    rocev2::Server srv(dev, sc);
    srv.set_fpga_gid(rocev2::parse_gid("127.0.0.1"));  // the FPGA's IP address
    rocev2_host_params hp = srv.host_params();          // program the FPGA with these
    uint32_t fpga_qpn = 0x4242;                         // read back from the FPGA
    srv.complete_connection(fpga_qpn, hp.sq_psn);

    std::string cmd = "'" + std::string(argv[1]) + "' fpga-sim --host 127.0.0.1:" + std::to_string(hp.udp_port) +
                      " --host-qpn " + std::to_string(hp.qpn) + " --psn " + std::to_string(hp.sq_psn) +
                      " --qpn " + std::to_string(fpga_qpn) + " --frames " + std::to_string(frames) +
                      " --size " + std::to_string(size) + " --channels 0,1,2,3 >/dev/null";
    FILE* emu = popen(cmd.c_str(), "r");  // runs beside this loop
    if (!emu) throw std::runtime_error("cannot start " + cmd);
    unsigned long got = 0, bad = 0;
    while (got < frames) {
        std::optional<rocev2::Frame> f = srv.poll(std::chrono::seconds(10));
        if (!f) break;  // nothing for 10 s
        uint64_t seq;
        std::memcpy(&seq, f->data(), sizeof seq);  // zero copy: data() points into the slab
        if (seq != got || f->channel() != seq % 4) ++bad;
        ++got;
    }  // each Frame is released (its slot re-posted) when it goes out of scope
    int status = pclose(emu);
    std::printf("stream (C++): %lu of %lu frames, %llu bytes, %lu out of order; emulator exit %d\n", got, frames,
                static_cast<unsigned long long>(srv.stats().bytes), bad, status);
    return status == 0 && got == frames && bad == 0 ? 0 : 1;
} catch (const rocev2::Error& e) {
    std::fprintf(stderr, "stream_cpp: %s (status %d)\n", e.what(), static_cast<int>(e.status()));
    return 1;
}
