// A rogue stream graph fed by rocev2 (through the rogue drop-in) from the FPGA
// emulator over the soft backend: a C++ rogue Slave gets every frame
// zero-copy (its data pointer lies inside the server's slab), in order,
// byte-exact, on the right channel; holding frames stalls the sender,
// returning them resumes it.
//
// Build against a rogue built with -DROGUE_ROCEV2_RS=ON (see README.md):
//   g++ -std=c++17 stream_graph.cpp -I<rogue>/include -I<rocev2>/include \
//       -L<rogue build> -lrogue-core -L<rocev2>/lib -lrocev2 -lpthread $(python3-config --includes)
// Run: ./stream_graph <path to the rocev2 CLI>  (uses 127.0.0.1:4791 and 127.0.0.2:4791)
#include <arpa/inet.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rogue/interfaces/stream/Frame.h"
#include "rogue/interfaces/stream/FrameIterator.h"
#include "rogue/interfaces/stream/FrameLock.h"
#include "rogue/interfaces/stream/Slave.h"
#include "rogue/protocols/rocev2/Server.h"

namespace ris = rogue::interfaces::stream;
namespace rr  = rogue::protocols::rocev2;

static const uint32_t N = 2000, SIZE = 1024, DEPTH = 16;

static bool patternOk(const uint8_t* d, uint32_t len, uint64_t* seqOut) {
    uint64_t seq = 0;
    for (int i = 7; i >= 0; --i) seq = (seq << 8) | d[i];
    uint32_t s = static_cast<uint32_t>((seq * 0x9E3779B97F4A7C15ull) >> 32) | 1u;
    for (uint32_t at = 8; at < len; at += 4) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        for (uint32_t k = 0; k < 4 && at + k < len; ++k)
            if (d[at + k] != static_cast<uint8_t>(s >> (8 * k))) return false;
    }
    *seqOut = seq;
    return true;
}

class Sink : public ris::Slave {
  public:
    uint64_t mrAddr = 0, mrLen = 0;
    std::atomic<uint64_t> count{0}, errors{0}, zeroCopy{0};
    std::mutex m;
    std::vector<ris::FramePtr> held;
    bool hold = true;

    void acceptFrame(ris::FramePtr frame) override {
        auto lock = frame->lock();
        auto it   = frame->begin();
        const uint8_t* p = it.ptr();
        uint64_t a = reinterpret_cast<uint64_t>(p);
        if (a >= mrAddr && a + frame->getPayload() <= mrAddr + mrLen) zeroCopy++;
        uint64_t seq = 0;
        uint64_t want = count.load();
        if (frame->getPayload() != SIZE || !patternOk(p, SIZE, &seq) || seq != want ||
            frame->getChannel() != seq % 3 || frame->getFirstUser() != 0x02)
            errors++;
        std::lock_guard<std::mutex> g(m);
        if (hold && held.size() < DEPTH) held.push_back(frame);
        count++;
    }
};

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s <rocev2 CLI>\n", argv[0]);
        return 2;
    }
    auto srv  = rr::Server::create("soft", 1, 0, SIZE, DEPTH);
    auto sink = std::make_shared<Sink>();
    sink->mrAddr = srv->getMrAddr();
    sink->mrLen  = static_cast<uint64_t>(SIZE) * DEPTH;
    srv->addSlave(sink);
    std::string gid(16, '\0');
    gid[10] = gid[11] = '\xff';
    in_addr fpga;
    inet_aton("127.0.0.2", &fpga);
    gid.replace(12, 4, reinterpret_cast<const char*>(&fpga), 4);
    srv->setFpgaGid(gid);
    srv->completeConnection(0x4242, srv->getSqPsn(), 5, 1);

    std::string cmd = std::string(argv[1]) + " fpga-sim --bind 127.0.0.2:4791 --host 127.0.0.1:4791 --host-qpn " +
                      std::to_string(srv->getQpn()) + " --psn " + std::to_string(srv->getSqPsn()) +
                      " --qpn 0x4242 --frames " + std::to_string(N) + " --size " + std::to_string(SIZE) +
                      " --channels 0,1,2";
    int simRc = -1;
    std::thread sim([&] { simRc = std::system(cmd.c_str()); });

    auto waitFor = [](auto cond) {
        auto t0 = std::chrono::steady_clock::now();
        while (!cond() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
    };
    waitFor([&] { std::lock_guard<std::mutex> g(sink->m); return sink->held.size() == DEPTH; });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    uint64_t stalled = sink->count.load();
    std::printf("held %u frames: the sender is stalled at %llu frames\n", DEPTH, (unsigned long long)stalled);
    {
        std::lock_guard<std::mutex> g(sink->m);
        sink->hold = false;
        sink->held.clear();  // returning the frames re-posts their slots
    }
    sim.join();
    waitFor([&] { return sink->count.load() == N; });
    srv->stop();
    bool ok = stalled == DEPTH && simRc == 0 && sink->count == N && sink->errors == 0 && sink->zeroCopy == N &&
              srv->getFrameCount() == N;
    std::printf("C++ Slave: %llu frames, %llu errors, %llu zero-copy (data pointer inside the slab) -> %s\n",
                (unsigned long long)sink->count.load(), (unsigned long long)sink->errors.load(),
                (unsigned long long)sink->zeroCopy.load(), ok ? "OK" : "FAILED");
    return ok ? 0 : 1;
}
