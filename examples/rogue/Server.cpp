/*
 * rocev2 adapter for rogue: rogue::protocols::rocev2::Server over librocev2.
 *
 * Written for the rocev2 project. Compiles against rogue's unchanged header
 * include/rogue/protocols/rocev2/Server.h and replaces rogue's Server.cpp
 * when rogue is built with -DROGUE_ROCEV2_RS=ON (see README.md beside this
 * file). All protocol, threading and ownership logic lives in librocev2; this
 * file only translates:
 *
 *  - frames: librocev2 hands each received frame on loan; runThread() (the
 *    header's receive thread, named "RoCEv2Server") pulls them and wraps each
 *    zero-copy as a rogue Buffer (meta = slot), channel = immediate low byte,
 *    first user = SSI SOF; retBuffer() releases the loan's token, which
 *    re-posts the slot. Every Buffer holds the Server (rogue's Pool
 *    contract), so the library handle outlives the last frame.
 *  - errors: librocev2's messages become rogue::GeneralError (same texts).
 *  - GIL: construction, completeConnection, stop and retBuffer release it.
 *
 * The header's ibverbs members are unused: `qp_` carries the adapter state
 * (librocev2 handle and the token of each loaned slot); the rest stay NULL.
 */
#include "rogue/Directives.h"

#include "rogue/protocols/rocev2/Server.h"

#include <rocev2.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

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
void installLogForwarding();

struct State {
    rocev2_server* srv = nullptr;
    std::unique_ptr<std::atomic<uint64_t>[]> tokens;  // token of the frame loaned in each slot
};
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
    log_ = rogue::Logging::create("rocev2.Server");
    memset(hostGid_, 0, 16);
    memset(fpgaGid_, 0, 16);
    wakeFd_[0] = wakeFd_[1] = -1;
    rogue::GilRelease noGil;

    rocev2_server_config cfg;
    rocev2_server_config_init(&cfg);
    cfg.max_payload    = maxPayload;
    cfg.rx_queue_depth = rxQueueDepth;
    // rogue reports the MR rkey (and its tests expect a non-zero one); the QP
    // still grants no remote access, so no peer can write into the slab.
    cfg.mr_remote_write = 1;
    auto st = std::make_unique<adapter::State>();
    if (rocev2_server_create(reinterpret_cast<rocev2_device*>(ctx_), &cfg, &st->srv) != ROCEV2_OK)
        fail("rocev2::Server::Server");
    st->tokens.reset(new std::atomic<uint64_t>[rxQueueDepth]);
    for (uint32_t i = 0; i < rxQueueDepth; ++i) st->tokens[i].store(0);

    rocev2_host_params hp;
    rocev2_server_get_host_params(st->srv, &hp);
    hostQpn_   = hp.qpn;
    hostRqPsn_ = hp.rq_psn;
    hostSqPsn_ = hp.sq_psn;
    mrAddr_    = hp.mr_addr;
    mrRkey_    = hp.mr_rkey;
    slab_      = reinterpret_cast<uint8_t*>(hp.mr_addr);
    slabSize_  = hp.mr_len;
    memcpy(hostGid_, hp.gid, 16);
    qp_ = reinterpret_cast<struct ibv_qp*>(st.release());
    log_->info("RC QP ready: qpn=0x%06x rqPsn=0x%06x sqPsn=0x%06x", hostQpn_, hostRqPsn_, hostSqPsn_);
}

void rpr::Server::setFpgaGid(const std::string& gidBytes) {
    if (gidBytes.size() != 16)
        throw(rogue::GeneralError::create("rocev2::Server::setFpgaGid", "GID must be 16 bytes, got %zu",
                                          gidBytes.size()));
    if (rocev2_server_set_fpga_gid(stateOf(qp_)->srv, reinterpret_cast<const uint8_t*>(gidBytes.data())) !=
        ROCEV2_OK)
        fail("rocev2::Server::setFpgaGid");
    memcpy(fpgaGid_, gidBytes.data(), 16);
    log_->info("FPGA GID stored");
}

void rpr::Server::completeConnection(uint32_t fpgaQpn, uint32_t fpgaRqPsn, uint32_t pmtu, uint32_t minRnrTimer) {
    rogue::GilRelease noGil;
    if (thread_ != nullptr)
        throw(rogue::GeneralError::create("rocev2::Server::completeConnection",
                                          "completeConnection already invoked; destroy and recreate "
                                          "Server to re-establish the RC connection"));
    if (rocev2_server_complete_connection(stateOf(qp_)->srv, fpgaQpn, fpgaRqPsn, pmtu, minRnrTimer) != ROCEV2_OK)
        fail("rocev2::Server::completeConnection");
    std::shared_ptr<int> scope = std::make_shared<int>(0);
    threadEn_.store(true);
    thread_ = new std::thread(&rpr::Server::runThread, this, std::weak_ptr<int>(scope));
#ifndef __MACH__
    pthread_setname_np(thread_->native_handle(), "RoCEv2Server");
#endif
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

// Not used: completions arrive through librocev2 (see runThread).
void rpr::Server::processCompletion(struct ibv_wc& wc) {
    (void)wc;
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

void rpr::Server::runThread(std::weak_ptr<int> lockPtr) {
    while (!lockPtr.expired()) continue;
    log_->logThreadId();
    log_->info("RoCEv2 receive thread started (librocev2)");
    rogue::GilRelease noGil;
    adapter::State* st = stateOf(qp_);
    while (threadEn_.load()) {
        rocev2_frame f;
        rocev2_status s = rocev2_server_poll_frame(st->srv, 100, &f);
        if (s == ROCEV2_ERR_TIMEOUT) continue;
        if (s != ROCEV2_OK) {
            if (s != ROCEV2_ERR_STOPPED) log_->error("receive thread exiting: %s", adapter::lastError().c_str());
            break;
        }
        if (f.slot >= numBufs_) {  // cannot happen: slots come from this server
            rocev2_server_release(st->srv, f.token);
            continue;
        }
        st->tokens[f.slot].store(f.token);
        ris::BufferPtr buff = createBuffer(const_cast<uint8_t*>(f.data), f.slot & 0x00FFFFFF, f.len, bufSize_);
        buff->setPayload(f.len);
        ris::FramePtr frame = ris::Frame::create();
        frame->appendBuffer(buff);
        frame->setChannel(static_cast<uint8_t>(f.channel));
        frame->setFirstUser(SsiSof);
        frame->setLastUser(0);
        sendFrame(frame);
        frameCount_.fetch_add(1, std::memory_order_relaxed);
        byteCount_.fetch_add(f.len, std::memory_order_relaxed);
    }
    threadEn_.store(false);
    log_->info("RoCEv2 receive thread stopped");
}

void rpr::Server::cleanupResources() {
    adapter::State* st = stateOf(qp_);
    if (st) rocev2_server_stop(st->srv);
}

void rpr::Server::acceptFrame(ris::FramePtr frame) {
    (void)frame;
    log_->warning("RoCEv2 Server::acceptFrame: TX not supported, dropping");
}

void rpr::Server::stop() {
    rogue::GilRelease noGil;
    threadEn_.store(false);
    cleanupResources();  // librocev2 stop: the pull in runThread returns STOPPED
    if (thread_) {
        if (thread_->joinable()) {
            if (thread_->get_id() == std::this_thread::get_id())
                thread_->detach();
            else
                thread_->join();
        }
        delete thread_;
        thread_ = nullptr;
    }
}

rpr::Server::~Server() {
    this->stop();
    adapter::State* st = stateOf(qp_);
    if (st) {
        // Every Buffer holds this Server, so no loan is outstanding here.
        rocev2_server_destroy(st->srv);
        delete st;
        qp_ = nullptr;
    }
}

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
        .def("stop", &rpr::Server::stop);
    bp::implicitly_convertible<rpr::ServerPtr, rpr::CorePtr>();
    bp::implicitly_convertible<rpr::ServerPtr, ris::MasterPtr>();
    bp::implicitly_convertible<rpr::ServerPtr, ris::SlavePtr>();
#endif
}
