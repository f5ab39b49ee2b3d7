/*
 * rocev2 adapter for rogue: rogue::protocols::rocev2::Server over librocev2.
 *
 * Written for the rocev2 project. Compiles against rogue's unchanged header
 * include/rogue/protocols/rocev2/Server.h and replaces rogue's Server.cpp
 * when rogue is built with -DROGUE_ROCEV2_RS=ON (see README.md beside this
 * file). All protocol, threading and ownership logic lives in librocev2; this
 * file only translates:
 *
 *  - frames: one receive thread, librocev2's ("RoCEv2Server"). Its frame
 *    callback (registered at construction) wraps each frame zero-copy as a
 *    rogue Buffer (meta = slot), channel = immediate low byte, first user =
 *    SSI SOF, and calls sendFrame() on that thread; retBuffer() releases the
 *    loan's token, which re-posts the slot. Every Buffer holds the Server
 *    (rogue's Pool contract), so the library handle outlives the last frame.
 *    The header's runThread()/thread_ are unused.
 *  - exceptions from downstream Slaves (e.g. a StreamWriter over its size
 *    limit) never leave the callback: like upstream's runThread, the error is
 *    logged once and delivery ends. The frame that threw is released; every
 *    later frame is parked unreleased, so its slot is not re-posted and the
 *    FPGA sees RNR back-pressure (upstream: the QP stays up, nothing re-posts)
 *    until stop(), which releases them. The process keeps running; the
 *    getters and stop() work as before.
 *  - errors: librocev2's messages become rogue::GeneralError (same texts).
 *  - logs: librocev2 logs bring-up (device, QP, FPGA GID) once, to rogue's
 *    logger "rocev2.Server"; this file adds only what the library cannot know.
 *  - GIL: construction, completeConnection, stop and retBuffer release it.
 *  - link health: Server.getStats() in Python (adapter::stats() in C++)
 *    returns one snapshot of rocev2_stats (every field, listed once in
 *    ROCEV2_ADAPTER_STATS below), the link state and its end cause, the
 *    backend and the latency percentiles in microseconds; rocev2_pyrogue.py
 *    shows them as a pyrogue Device.
 *
 * The header's ibverbs members are unused: `qp_` carries the adapter state
 * (librocev2 handle and the token of each loaned slot); the rest stay NULL.
 */
#include "rogue/Directives.h"

#include "rogue/protocols/rocev2/Server.h"

#include <rocev2.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rogue/GeneralError.h"
#include "rogue/GilRelease.h"
#include "rogue/Logging.h"
#include "rogue/interfaces/stream/Buffer.h"
#include "rogue/interfaces/stream/Frame.h"

#ifndef NO_PYTHON
    #include <boost/python.hpp>
namespace bp = boost::python;
#endif

namespace rpr = rogue::protocols::rocev2;
namespace ris = rogue::interfaces::stream;

namespace rogue {
namespace protocols {
namespace rocev2 {
namespace adapter {
std::string lastError();
std::shared_ptr<rogue::Logging> serverLog();

struct State {
    rocev2_server* srv = nullptr;
    std::unique_ptr<std::atomic<uint64_t>[]> tokens;  // token of the frame loaned in each slot
    std::atomic<bool> connected{false};               // completeConnection succeeded
    std::mutex parkedMx;
    std::vector<uint64_t> parked;  // frames held after delivery ended (see the header comment)
};

// The UDP port the soft backend bound (the ephemeral one for
// ROCEV2_SOFT_PORT=0), 4791 on verbs. Not in rogue's header, so C++ callers
// declare it themselves (README.md); Python gets Server.getUdpPort().
uint16_t udpPort(const rpr::Server& server);

// One snapshot of the library's counters (one rocev2_server_get_stats call)
// into `out`, with the end cause and the backend ("soft" or "verbs") when
// asked for; false when the server is gone. Python: Server.getStats().
bool stats(const rpr::Server& server, rocev2_stats* out, std::string* endCause, std::string* backend);

// Every rocev2_stats field Server.getStats() returns, by name: a field the
// library adds is one X(name) line here (and one row in rocev2_pyrogue.py
// for a pyrogue variable). The latency fields are returned in microseconds
// too (ROCEV2_ADAPTER_LATENCY).
#define ROCEV2_ADAPTER_STATS(X)                                                                         \
    X(frames) X(bytes) X(releases) X(reposts) X(repost_batches) X(parks) X(completion_errors)            \
    X(flush_errors) X(bad_length) X(unexpected_opcode) X(invalid_releases) X(callback_panics)            \
    X(packets_rx) X(packets_tx) X(acks_tx) X(rnr_naks_tx) X(seq_naks_tx) X(invalid_naks_tx)              \
    X(duplicates) X(out_of_sequence) X(foreign_packets) X(malformed) X(icrc_errors) X(icrc_unchecked)    \
    X(loans_outstanding) X(icrc_checked) X(payload_direct) X(payload_copied) X(socket_drops)             \
    X(link_state) X(us_since_last_packet) X(us_since_last_frame) X(stale_packets) X(peer_restarts)       \
    X(naps) X(lost_frames_estimate) X(stale_peers) X(peer_stale) X(peer_watched)                         \
    X(ack_turnaround_count) X(ack_turnaround_p50_ns) X(ack_turnaround_p99_ns) X(ack_turnaround_p999_ns) \
    X(ack_turnaround_max_ns) X(delivery_count) X(delivery_p50_ns) X(delivery_p99_ns)                    \
    X(delivery_p999_ns) X(delivery_max_ns) X(counter_gaps) X(counter_gap_frames) X(counter_resets)        \
    X(duplicating_peers) X(duplicating_peer) X(rnr_storms) X(rnr_storm)
#define ROCEV2_ADAPTER_LATENCY(X)                                                                       \
    X(ack_turnaround_p50) X(ack_turnaround_p99) X(ack_turnaround_p999) X(ack_turnaround_max)             \
    X(delivery_p50) X(delivery_p99) X(delivery_p999) X(delivery_max)

namespace {
// What the free functions above need of a live Server (its private members
// are out of their reach): registered by the constructor, erased by the
// destructor before the library handle is destroyed.
struct Info {
    uint16_t port       = 0;
    rocev2_server* srv  = nullptr;
    const char* backend = "";
};
std::mutex portsMx;
std::unordered_map<const rpr::Server*, Info> ports;
// True on the receive thread while the frame callback runs.
thread_local bool inFrameCallback = false;
}  // namespace

uint16_t udpPort(const rpr::Server& server) {
    std::lock_guard<std::mutex> g(portsMx);
    auto it = ports.find(&server);
    return it == ports.end() ? 0 : it->second.port;
}

bool stats(const rpr::Server& server, rocev2_stats* out, std::string* endCause, std::string* backend) {
    std::lock_guard<std::mutex> g(portsMx);  // the server is not destroyed meanwhile
    auto it = ports.find(&server);
    if (it == ports.end() || out == nullptr) return false;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    if (rocev2_server_get_stats(it->second.srv, out) != ROCEV2_OK) return false;
    if (endCause) {
        std::string cause(rocev2_server_end_cause(it->second.srv, nullptr, 0) + 1, '\0');
        size_t n = rocev2_server_end_cause(it->second.srv, &cause[0], cause.size());
        cause.resize(n < cause.size() ? n : cause.size() - 1);
        *endCause = cause;
    }
    if (backend) *backend = it->second.backend;
    return true;
}
}  // namespace adapter
}  // namespace rocev2
}  // namespace protocols
}  // namespace rogue

namespace {
const uint8_t SsiSof = 0x02;

rpr::adapter::State* stateOf(struct ibv_qp* qp) {
    return reinterpret_cast<rpr::adapter::State*>(qp);
}

[[noreturn]] void fail(const char* where) {
    throw(rogue::GeneralError::create(where, "%s", rpr::adapter::lastError().c_str()));
}

// Marks the receive thread while the frame callback runs (see ~Server).
struct CallbackScope {
    CallbackScope() { rpr::adapter::inFrameCallback = true; }
    ~CallbackScope() { rpr::adapter::inFrameCallback = false; }
};
}  // namespace

rpr::ServerPtr rpr::Server::create(const std::string& deviceName,
                                   uint8_t ibPort,
                                   uint8_t gidIndex,
                                   uint32_t maxPayload,
                                   uint32_t rxQueueDepth) {
    return std::make_shared<rpr::Server>(deviceName, ibPort, gidIndex, maxPayload, rxQueueDepth);
}

rpr::Server::Server(const std::string& deviceName,
                    uint8_t ibPort,
                    uint8_t gidIndex,
                    uint32_t maxPayload,
                    uint32_t rxQueueDepth)
    : rpr::Core(deviceName, ibPort, gidIndex, maxPayload),
      ris::Master(),
      ris::Slave(),
      cq_(nullptr), qp_(nullptr), mr_(nullptr), comp_channel_(nullptr),
      slab_(nullptr), slabSize_(0), numBufs_(rxQueueDepth), bufSize_(maxPayload),
      hostQpn_(0), hostRqPsn_(0), hostSqPsn_(0), mrAddr_(0), mrRkey_(0),
      thread_(nullptr), threadEn_(false), frameCount_(0), byteCount_(0) {
    log_ = adapter::serverLog();
    memset(hostGid_, 0, 16);
    memset(fpgaGid_, 0, 16);
    wakeFd_[0] = wakeFd_[1] = -1;
    rogue::GilRelease noGil;

    rocev2_server_config cfg;
    rocev2_server_config_init(&cfg, sizeof cfg);
    cfg.max_payload    = maxPayload;
    cfg.rx_queue_depth = rxQueueDepth;
    // rogue reports the MR rkey (and its tests expect a non-zero one); the QP
    // still grants no remote access, so no peer can write into the slab.
    cfg.mr_remote_write = 1;
    // ROCEV2_MEASURE_LATENCY=1: the ACK turnaround and delivery latency
    // percentiles in getStats() (soft backend; verbs refuses it).
    if (const char* m = std::getenv("ROCEV2_MEASURE_LATENCY")) {
        const std::string v(m);
        if (v == "1")
            cfg.measure_latency = 1;
        else if (v != "0" && !v.empty())
            throw(rogue::GeneralError::create("rocev2::Server::Server",
                                              "ROCEV2_MEASURE_LATENCY='%s' is not 0 or 1: set 1 to measure "
                                              "the ACK turnaround and delivery latency (soft backend), 0 not to",
                                              m));
    }
    // ROCEV2_COUNTER_WRAP=N: check the FPGA's frame counter (immediate bits
    // [31:8], +1 per frame, wrapping at N: surf's AddrWrapCount); gaps and
    // resets are counted in getStats() (counter_gaps, counter_resets). Unset
    // or 0: not checked.
    if (const char* m = std::getenv("ROCEV2_COUNTER_WRAP")) {
        char* end            = nullptr;
        const unsigned long n = std::strtoul(m, &end, 0);
        if (*m == '\0' || *end != '\0' || n > (1ul << 24))
            throw(rogue::GeneralError::create("rocev2::Server::Server",
                                              "ROCEV2_COUNTER_WRAP='%s' is not a number from 0 to 16777216: "
                                              "set the FPGA's AddrWrapCount, or 0 not to check its frame counter",
                                              m));
        cfg.counter_wrap = static_cast<uint32_t>(n);
    }
    auto st = std::make_unique<adapter::State>();
    if (rocev2_server_create(reinterpret_cast<rocev2_device*>(ctx_), &cfg, &st->srv) != ROCEV2_OK)
        fail("rocev2::Server::Server");
    st->tokens.reset(new std::atomic<uint64_t>[rxQueueDepth]);
    for (uint32_t i = 0; i < rxQueueDepth; ++i) st->tokens[i].store(0);

    // The frame callback: runs on librocev2's receive thread for every frame.
    // Defined here so it may use the Server's private members. librocev2
    // starts no callback after rocev2_server_stop returns, and stop() runs
    // first in ~Server, so `self` is alive whenever it runs.
    auto onFrame = [](void* user, const rocev2_frame* f) {
        CallbackScope scope;
        rpr::Server* self  = static_cast<rpr::Server*>(user);
        adapter::State* st = stateOf(self->qp_);
        if (f->slot >= self->numBufs_) {  // cannot happen: slots come from this server
            rocev2_server_release(st->srv, f->token);
            return;
        }
        // rogue's behaviour, kept for rogue users: a message without an
        // immediate, or of 0 bytes, is dropped with rogue's warning texts
        // (librocev2 itself delivers both; see README.md).
        if (!(f->flags & ROCEV2_FRAME_HAS_IMMEDIATE)) {
            self->log_->warning("Unexpected opcode %d / wc_flags 0x%x (slot=%u); re-posting", 0, 0u, f->slot);
            rocev2_server_release(st->srv, f->token);
            return;
        }
        if (f->len == 0) {
            self->log_->warning("Bad payload len=%u (slot=%u); re-posting", f->len, f->slot);
            rocev2_server_release(st->srv, f->token);
            return;
        }
        if (!self->threadEn_.load()) {  // delivery ended: keep the slot, see the header comment
            std::lock_guard<std::mutex> g(st->parkedMx);
            st->parked.push_back(f->token);
            return;
        }
        // Holds the Server to the end of the callback (declared after `scope`,
        // so a ~Server run by its release still sees inFrameCallback).
        std::shared_ptr<rogue::EnableSharedFromThisBase> keep;
        st->tokens[f->slot].store(f->token);
        bool wrapped = false;  // from here on, the Buffer's retBuffer() releases the token
        try {
            keep                = self->rogue::EnableSharedFromThisBase::shared_from_this();
            ris::BufferPtr buff = self->createBuffer(const_cast<uint8_t*>(f->data), f->slot & 0x00FFFFFF, f->len,
                                                     self->bufSize_);
            wrapped             = true;
            buff->setPayload(f->len);
            ris::FramePtr frame = ris::Frame::create();
            frame->appendBuffer(buff);
            frame->setChannel(static_cast<uint8_t>(f->channel));
            frame->setFirstUser(SsiSof);
            frame->setLastUser(0);
            self->sendFrame(frame);
            self->frameCount_.fetch_add(1, std::memory_order_relaxed);
            self->byteCount_.fetch_add(f->len, std::memory_order_relaxed);
            return;
        } catch (const std::exception& e) {  // rogue::GeneralError is one
            self->log_->error(
                "RoCEv2 frame delivery stopped by an exception from sendFrame (a downstream Slave): %s. No "
                "further frame is delivered; received slots stay unreleased (the FPGA sees RNR back-pressure) "
                "until stop()",
                e.what());
        } catch (...) {
            self->log_->error(
                "RoCEv2 frame delivery stopped by an unknown exception from sendFrame (a downstream Slave). No "
                "further frame is delivered; received slots stay unreleased (the FPGA sees RNR back-pressure) "
                "until stop()");
        }
        self->threadEn_.store(false);
        if (!wrapped) {
            uint64_t token = st->tokens[f->slot].exchange(0);
            if (token != 0) rocev2_server_release(st->srv, token);
        }
    };
    if (rocev2_server_register_frame_callback(st->srv, onFrame, this) != ROCEV2_OK) {
        const std::string msg = adapter::lastError();
        rocev2_server_destroy(st->srv);
        throw(rogue::GeneralError::create("rocev2::Server::Server", "%s", msg.c_str()));
    }

    rocev2_host_params hp{};
    hp.struct_size = sizeof hp;
    rocev2_server_get_host_params(st->srv, &hp);
    hostQpn_   = hp.qpn;
    hostRqPsn_ = hp.rq_psn;
    hostSqPsn_ = hp.sq_psn;
    mrAddr_    = hp.mr_addr;
    mrRkey_    = hp.mr_rkey;
    slab_      = reinterpret_cast<uint8_t*>(hp.mr_addr);
    slabSize_  = hp.mr_len;
    memcpy(hostGid_, hp.gid, 16);
    {
        std::lock_guard<std::mutex> g(adapter::portsMx);
        adapter::Info& info = adapter::ports[this];
        info.port           = hp.udp_port;
        info.srv            = st->srv;
        info.backend        = deviceName_ == "soft" ? "soft" : "verbs";
    }
    qp_ = reinterpret_cast<struct ibv_qp*>(st.release());
}

void rpr::Server::setFpgaGid(const std::string& gidBytes) {
    if (gidBytes.size() != 16)
        throw(rogue::GeneralError::create("rocev2::Server::setFpgaGid", "GID must be 16 bytes, got %zu",
                                          gidBytes.size()));
    if (rocev2_server_set_fpga_gid(stateOf(qp_)->srv, reinterpret_cast<const uint8_t*>(gidBytes.data())) !=
        ROCEV2_OK)
        fail("rocev2::Server::setFpgaGid");
    memcpy(fpgaGid_, gidBytes.data(), 16);
}

void rpr::Server::completeConnection(uint32_t fpgaQpn, uint32_t fpgaRqPsn, uint32_t pmtu, uint32_t minRnrTimer) {
    rogue::GilRelease noGil;
    adapter::State* st = stateOf(qp_);
    if (st->connected.load())
        throw(rogue::GeneralError::create("rocev2::Server::completeConnection",
                                          "completeConnection already invoked; destroy and recreate "
                                          "Server to re-establish the RC connection"));
    threadEn_.store(true);  // before the receive thread can deliver its first frame
    if (rocev2_server_complete_connection(st->srv, fpgaQpn, fpgaRqPsn, pmtu, minRnrTimer) != ROCEV2_OK) {
        threadEn_.store(false);
        fail("rocev2::Server::completeConnection");
    }
    st->connected.store(true);
}

std::string rpr::Server::getGid() const {
    char buf[40];
    rocev2_gid_format(hostGid_, buf, sizeof buf);
    return buf;
}

// The header's per-slot re-post hook: librocev2 re-posts released slots itself.
void rpr::Server::postRecvWr(uint32_t slot) {
    (void)slot;
}

// Not used: frames arrive through librocev2's frame callback.
void rpr::Server::processCompletion(struct ibv_wc& wc) {
    (void)wc;
}

// Not used: librocev2's receive thread runs the frame callback (no second thread).
void rpr::Server::runThread(std::weak_ptr<int> lockPtr) {
    (void)lockPtr;
}

void rpr::Server::retBuffer(uint8_t* data, uint32_t meta, uint32_t rawSize) {
    (void)data;
    rogue::GilRelease noGil;
    adapter::State* st = stateOf(qp_);
    uint32_t slot = meta & 0x00FFFFFF;
    if (st && slot < numBufs_) {
        uint64_t token = st->tokens[slot].exchange(0);
        if (token != 0 && rocev2_server_release(st->srv, token) != ROCEV2_OK)
            log_->warning("release of slot %u failed: %s", slot, adapter::lastError().c_str());
    }
    decCounter(rawSize);
}

// librocev2 stop (no callback starts after it returns; the receive thread is
// joined, or detached when called from a callback), then the parked frames.
void rpr::Server::cleanupResources() {
    adapter::State* st = stateOf(qp_);
    if (!st) return;
    rocev2_server_stop(st->srv);
    std::vector<uint64_t> parked;
    {
        std::lock_guard<std::mutex> g(st->parkedMx);
        parked.swap(st->parked);
    }
    for (uint64_t token : parked) rocev2_server_release(st->srv, token);
}

void rpr::Server::acceptFrame(ris::FramePtr frame) {
    (void)frame;
    log_->warning("RoCEv2 Server::acceptFrame: TX not supported, dropping");
}

void rpr::Server::stop() {
    rogue::GilRelease noGil;  // a Python Slave inside the callback needs the GIL to finish
    threadEn_.store(false);
    cleanupResources();
}

rpr::Server::~Server() {
    this->stop();
    {
        std::lock_guard<std::mutex> g(adapter::portsMx);
        adapter::ports.erase(this);
    }
    adapter::State* st = stateOf(qp_);
    if (st) {
        // Every Buffer holds this Server, so no loan is outstanding here.
        // The last Buffer may be dropped inside the frame callback, running
        // this destructor on the receive thread, where librocev2 forbids
        // destroy: hand it to a short-lived thread then.
        rocev2_server* srv = st->srv;
        if (adapter::inFrameCallback)
            std::thread([srv] { rocev2_server_destroy(srv); }).detach();
        else
            rocev2_server_destroy(srv);
        delete st;
        qp_ = nullptr;
    }
}

#ifndef NO_PYTHON
namespace {
bp::dict pyStats(const rpr::Server& server) {
    rocev2_stats s;
    std::string cause, backend;
    bool ok;
    {
        rogue::GilRelease noGil;
        ok = rpr::adapter::stats(server, &s, &cause, &backend);
    }
    if (!ok)
        throw(rogue::GeneralError::create("rocev2::Server::getStats", "the server's statistics cannot be read: %s",
                                          rpr::adapter::lastError().c_str()));
    static const char* const states[] = {"created", "connected", "error", "stopped"};
    bp::dict d;
#define ROCEV2_ADAPTER_PUT(f) d[#f] = s.f;
    ROCEV2_ADAPTER_STATS(ROCEV2_ADAPTER_PUT)
#undef ROCEV2_ADAPTER_PUT
#define ROCEV2_ADAPTER_PUT_US(f) d[#f "_us"] = static_cast<double>(s.f##_ns) / 1000.0;
    ROCEV2_ADAPTER_LATENCY(ROCEV2_ADAPTER_PUT_US)
#undef ROCEV2_ADAPTER_PUT_US
    d["link_state_name"] = s.link_state < 4 ? states[s.link_state] : "unknown";
    d["end_cause"]       = cause;
    d["backend"]         = backend;
    return d;
}
}  // namespace
#endif

void rpr::Server::setup_python() {
#ifndef NO_PYTHON
    bp::class_<rpr::Server, rpr::ServerPtr, bp::bases<rpr::Core, ris::Master, ris::Slave>, boost::noncopyable>(
        "Server",
        bp::init<std::string, uint8_t, uint8_t, uint32_t, uint32_t>(
            (bp::arg("deviceName"), bp::arg("ibPort") = 1, bp::arg("gidIndex") = 0,
             bp::arg("maxPayload") = rpr::DefaultMaxPayload, bp::arg("rxQueueDepth") = rpr::DefaultRxQueueDepth)))
        .def("create", &rpr::Server::create)
        .staticmethod("create")
        .def("setFpgaGid", &rpr::Server::setFpgaGid)
        .def("completeConnection", &rpr::Server::completeConnection,
             (bp::arg("fpgaQpn"), bp::arg("fpgaRqPsn"), bp::arg("pmtu") = 5, bp::arg("minRnrTimer") = 1))
        .def("getQpn", &rpr::Server::getQpn)
        .def("getGid", &rpr::Server::getGid)
        .def("getRqPsn", &rpr::Server::getRqPsn)
        .def("getSqPsn", &rpr::Server::getSqPsn)
        .def("getMrAddr", &rpr::Server::getMrAddr)
        .def("getMrRkey", &rpr::Server::getMrRkey)
        .def("getFrameCount", &rpr::Server::getFrameCount)
        .def("getByteCount", &rpr::Server::getByteCount)
        // Not in rogue's header: the UDP port the server receives on (the
        // bound one for ROCEV2_SOFT_PORT=0 on the soft backend; 4791 on verbs).
        .def("getUdpPort", &rpr::adapter::udpPort)
        // Not in rogue's header: one snapshot of the link's health as a dict
        // (every rocev2_stats field by name, link_state_name, end_cause,
        // backend, the latency percentiles in us as <name>_us).
        .def("getStats", &pyStats)
        .def("stop", &rpr::Server::stop);
    bp::implicitly_convertible<rpr::ServerPtr, rpr::CorePtr>();
    bp::implicitly_convertible<rpr::ServerPtr, ris::MasterPtr>();
    bp::implicitly_convertible<rpr::ServerPtr, ris::SlavePtr>();
#endif
}
