// rogue stream graphs fed by rocev2 (through the rogue drop-in) from the FPGA
// emulator over the soft backend, in one process:
//  1. a C++ Slave that throws on its 5th frame: the exception is caught and
//     logged, delivery ends (4 frames counted), the sender stalls (RNR),
//     stop() returns and the process goes on. This one runs on one address
//     with ROCEV2_SOFT_PORT=0, reading the bound port back with
//     rogue::protocols::rocev2::adapter::udpPort().
//  2. a C++ Slave gets every frame zero-copy (its data pointer lies inside the
//     server's slab), in order, byte-exact, on the right channel; holding
//     frames stalls the sender, returning them resumes it (server
//     127.0.0.1:4791, emulator 127.0.0.2:4791).
//
// Build against a rogue built with -DROGUE_ROCEV2_RS=ON (see README.md); with
// a Python rogue build add $(python3-config --includes), numpy's include
// directory and -lpython3.X, with a -DNO_PYTHON=1 build add -DNO_PYTHON:
//   g++ -std=c++17 stream_graph.cpp -I<rogue>/include -I<rocev2>/include
//       -L<rogue build> -lrogue-core -L<rocev2>/lib -lrocev2 -lpthread -o stream_graph
// Run: ./stream_graph <path to the rocev2 CLI>
#include <arpa/inet.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rogue/GeneralError.h"
#include "rogue/interfaces/stream/Frame.h"
#include "rogue/interfaces/stream/FrameIterator.h"
#include "rogue/interfaces/stream/FrameLock.h"
#include "rogue/interfaces/stream/Slave.h"
#include "rogue/protocols/rocev2/Server.h"
#ifndef NO_PYTHON
    // librogue-core.so of a Python build refers to numpy's API table, which
    // its users define: including this once does (rogue's test_main.cpp too).
    #include "rogue/numpy.h"
#endif

namespace ris = rogue::interfaces::stream;
namespace rr  = rogue::protocols::rocev2;

// The adapter's port getter (not in rogue's header, so declared here).
namespace rogue {
namespace protocols {
namespace rocev2 {
namespace adapter {
uint16_t udpPort(const Server& server);
}
}  // namespace rocev2
}  // namespace protocols
}  // namespace rogue

extern char** environ;

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

class Thrower : public ris::Slave {
  public:
    std::atomic<uint64_t> count{0};
    void acceptFrame(ris::FramePtr frame) override {
        (void)frame;
        if (++count == 5) throw rogue::GeneralError("Thrower::acceptFrame", "the 5th frame is refused");
    }
};

static std::string fpgaGid(const char* ip) {
    std::string gid(16, '\0');
    gid[10] = gid[11] = '\xff';
    in_addr a;
    inet_aton(ip, &a);
    gid.replace(12, 4, reinterpret_cast<const char*>(&a), 4);
    return gid;
}

// Starts `rocev2 fpga-sim` streaming N frames to the server; returns its pid.
static pid_t startSim(const std::string& cli, const rr::ServerPtr& srv, const std::string& host,
                      const std::string& bind, const std::string& qpn) {
    std::vector<std::string> args = {cli, "fpga-sim", "--bind", bind, "--host", host,
                                     "--host-qpn", std::to_string(srv->getQpn()),
                                     "--psn", std::to_string(srv->getSqPsn()), "--qpn", qpn,
                                     "--frames", std::to_string(N), "--size", std::to_string(SIZE),
                                     "--channels", "0,1,2"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, cli.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
    return pid;
}

template <class F>
static bool waitFor(F cond) {
    auto t0 = std::chrono::steady_clock::now();
    while (!cond() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return cond();
}

// 1. A Slave that throws: delivery ends, the process lives on.
static bool throwingSlave(const std::string& cli) {
    setenv("ROCEV2_SOFT_PORT", "0", 1);       // any free port
    setenv("ROCEV2_SOFT_PEER_PORT", "0", 1);  // ACKs to the sender's port
    auto srv = rr::Server::create("soft", 1, 0, SIZE, DEPTH);
    uint16_t port = rr::adapter::udpPort(*srv);
    auto thrower = std::make_shared<Thrower>();
    srv->addSlave(thrower);
    srv->setFpgaGid(fpgaGid("127.0.0.1"));
    srv->completeConnection(0x4141, srv->getSqPsn(), 5, 12);
    pid_t sim = startSim(cli, srv, "127.0.0.1:" + std::to_string(port), "127.0.0.1:0", "0x4141");
    waitFor([&] { return thrower->count.load() >= 5; });
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    int status = 0;
    bool simStalled = sim > 0 && waitpid(sim, &status, WNOHANG) == 0;
    uint64_t delivered = thrower->count.load(), counted = srv->getFrameCount();
    srv->stop();
    if (sim > 0) {
        kill(sim, SIGKILL);
        waitpid(sim, &status, 0);
    }
    bool ok = port != 0 && port != 4791 && delivered == 5 && counted == 4 && simStalled;
    std::printf("throwing C++ Slave on port %u (ROCEV2_SOFT_PORT=0): %llu frames reached it, the 5th threw; "
                "%llu counted; sender stalled until stop(): %s -> %s\n",
                port, (unsigned long long)delivered, (unsigned long long)counted, simStalled ? "yes" : "no",
                ok ? "OK" : "FAILED");
    return ok;
}

// 2. Zero-copy, order, content, RNR stall and resume.
static bool holdAndRelease(const std::string& cli) {
    setenv("ROCEV2_SOFT_PORT", "4791", 1);
    setenv("ROCEV2_SOFT_PEER_PORT", "4791", 1);
    auto srv  = rr::Server::create("soft", 1, 0, SIZE, DEPTH);
    auto sink = std::make_shared<Sink>();
    sink->mrAddr = srv->getMrAddr();
    sink->mrLen  = static_cast<uint64_t>(SIZE) * DEPTH;
    srv->addSlave(sink);
    srv->setFpgaGid(fpgaGid("127.0.0.2"));
    srv->completeConnection(0x4242, srv->getSqPsn(), 5, 1);
    pid_t sim = startSim(cli, srv, "127.0.0.1:4791", "127.0.0.2:4791", "0x4242");

    waitFor([&] { std::lock_guard<std::mutex> g(sink->m); return sink->held.size() == DEPTH; });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    uint64_t stalled = sink->count.load();
    std::printf("held %u frames: the sender is stalled at %llu frames\n", DEPTH, (unsigned long long)stalled);
    {
        std::lock_guard<std::mutex> g(sink->m);
        sink->hold = false;
        sink->held.clear();  // returning the frames re-posts their slots
    }
    int status = -1;
    if (sim > 0) waitpid(sim, &status, 0);
    bool simOk = sim > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    waitFor([&] { return sink->count.load() == N; });
    srv->stop();
    bool ok = stalled == DEPTH && simOk && sink->count == N && sink->errors == 0 && sink->zeroCopy == N &&
              srv->getFrameCount() == N;
    std::printf("C++ Slave: %llu frames, %llu errors, %llu zero-copy (data pointer inside the slab) -> %s\n",
                (unsigned long long)sink->count.load(), (unsigned long long)sink->errors.load(),
                (unsigned long long)sink->zeroCopy.load(), ok ? "OK" : "FAILED");
    return ok;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s <rocev2 CLI>\n", argv[0]);
        return 2;
    }
    int passed = 0, failed = 0;
    for (bool ok : {throwingSlave(argv[1]), holdAndRelease(argv[1])}) ok ? ++passed : ++failed;
    std::printf("stream_graph: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
