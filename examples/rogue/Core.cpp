/*
 * rocev2 adapter for rogue: rogue::protocols::rocev2::Core over librocev2.
 *
 * Written for the rocev2 project. Compiles against rogue's unchanged header
 * include/rogue/protocols/rocev2/Core.h and replaces rogue's Core.cpp when
 * rogue is built with -DROGUE_ROCEV2_RS=ON (see README.md beside this file).
 *
 * The header's ibverbs members are not used by this adapter: `ctx_` carries
 * the librocev2 device handle (rocev2_device*), `pd_` stays NULL.
 *
 * Soft backend: the device name "soft" opens rocev2's userspace RoCEv2
 * backend (no RDMA NIC needed; gidIndex is ignored). rogue's constructor has
 * no place for its bind address and ports, so they come from the
 * environment: ROCEV2_SOFT_BIND (127.0.0.1), ROCEV2_SOFT_PORT (4791; 0 = any
 * free port, read back with Server.getUdpPort()), ROCEV2_SOFT_PEER_PORT
 * (4791, the FPGA's UDP port, where ACKs go; 0 = each packet's source port),
 * ROCEV2_SOFT_ICRC (auto|off|require).
 */
#include "rogue/Directives.h"

#include "rogue/protocols/rocev2/Core.h"

#include <rocev2.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>

#include "rogue/GeneralError.h"
#include "rogue/Logging.h"

#ifndef NO_PYTHON
    #include <boost/python.hpp>
namespace bp = boost::python;
#endif

namespace rpr = rogue::protocols::rocev2;

namespace rogue {
namespace protocols {
namespace rocev2 {
namespace adapter {

std::string lastError() {
    std::string s(rocev2_last_error(nullptr, 0) + 1, '\0');
    rocev2_last_error(&s[0], s.size());
    s.resize(s.size() - 1);
    return s;
}

// rogue's logger "rocev2.Server", one per process: the library's records and
// the adapter's own lines (rogue prints "Starting logger" at each create).
std::shared_ptr<rogue::Logging> serverLog() {
    static std::shared_ptr<rogue::Logging> log = rogue::Logging::create("rocev2.Server");
    return log;
}

// Library log records go to rogue's logger "rocev2.Server" (installed once).
static void forwardLog(void*, rocev2_log_level level, const char*, const char* message) {
    static std::shared_ptr<rogue::Logging> log = serverLog();
    switch (level) {
        case ROCEV2_LOG_ERROR: log->error("%s", message); break;
        case ROCEV2_LOG_WARN: log->warning("%s", message); break;
        case ROCEV2_LOG_INFO: log->info("%s", message); break;
        default: log->debug("%s", message); break;
    }
}

// A UDP port from the environment: 0..65535, decimal or 0x hex.
static uint16_t envPort(const char* name, uint16_t dflt) {
    const char* p = std::getenv(name);
    if (p == nullptr || *p == '\0') return dflt;
    char* end = nullptr;
    errno = 0;
    unsigned long v = std::strtoul(p, &end, 0);
    if (*p == '-' || *end != '\0' || errno != 0 || v > 65535)
        throw(rogue::GeneralError::create("rocev2::Core::Core",
                                          "%s='%s' is not a UDP port: set 0..65535 (0 = %s) or unset it", name, p,
                                          std::string(name) == "ROCEV2_SOFT_PORT" ? "any free port"
                                                                                  : "reply to the source port"));
    return static_cast<uint16_t>(v);
}

void installLogForwarding() {
    static std::once_flag once;
    std::call_once(once, [] { rocev2_set_log_callback(forwardLog, nullptr, ROCEV2_LOG_DEBUG); });
}

}  // namespace adapter
}  // namespace rocev2
}  // namespace protocols
}  // namespace rogue

rpr::Core::Core(const std::string& deviceName, uint8_t ibPort, uint8_t gidIndex, uint32_t maxPayload)
    : ctx_(nullptr),
      pd_(nullptr),
      deviceName_(deviceName),
      ibPort_(ibPort),
      gidIndex_(gidIndex),
      maxPayload_(maxPayload) {
    log_ = rogue::Logging::create("rocev2.Core");
    adapter::installLogForwarding();

    rocev2_device_config cfg;
    rocev2_device_config_init(&cfg, sizeof cfg);
    cfg.name      = deviceName_.c_str();
    cfg.ib_port   = ibPort_;
    cfg.gid_index = gidIndex_;
    const char* bind = std::getenv("ROCEV2_SOFT_BIND");
    if (bind) cfg.bind_addr = bind;
    cfg.udp_port      = adapter::envPort("ROCEV2_SOFT_PORT", cfg.udp_port);
    cfg.peer_udp_port = adapter::envPort("ROCEV2_SOFT_PEER_PORT", cfg.peer_udp_port);
    if (const char* p = std::getenv("ROCEV2_SOFT_ICRC")) {
        const std::string mode(p);
        if (mode == "auto")
            cfg.icrc_check = ROCEV2_ICRC_AUTO;
        else if (mode == "off")
            cfg.icrc_check = ROCEV2_ICRC_OFF;
        else if (mode == "require")
            cfg.icrc_check = ROCEV2_ICRC_REQUIRE;
        else
            throw(rogue::GeneralError::create("rocev2::Core::Core",
                                              "ROCEV2_SOFT_ICRC='%s' is not a mode: set auto, off or require", p));
    }

    rocev2_device* dev = nullptr;
    if (rocev2_device_open(&cfg, &dev) != ROCEV2_OK)
        throw(rogue::GeneralError::create("rocev2::Core::Core", "%s", adapter::lastError().c_str()));
    ctx_ = reinterpret_cast<struct ibv_context*>(dev);

    // librocev2 logs the opened device itself (once, through forwardLog).
    log_->debug("librocev2 %s", rocev2_version());
}

rpr::Core::~Core() {
    rocev2_device_close(reinterpret_cast<rocev2_device*>(ctx_));
}

void rpr::Core::setup_python() {
#ifndef NO_PYTHON
    bp::class_<rpr::Core, rpr::CorePtr, boost::noncopyable>("Core", bp::no_init)
        .def("maxPayload", &rpr::Core::maxPayload);
    bp::scope().attr("DefaultMaxPayload")   = rpr::DefaultMaxPayload;
    bp::scope().attr("DefaultRxQueueDepth") = rpr::DefaultRxQueueDepth;
#endif
}
