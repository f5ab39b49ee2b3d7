// rocev2.hpp - header-only C++17 RAII wrapper over rocev2.h.
//
//   rocev2::Device dev("rxe0");                      // rogue's Core
//   rocev2::Server srv(dev);                         // slab, QP in INIT
//   srv.set_fpga_gid(rocev2::parse_gid("10.0.0.20"));
//   auto hp = srv.host_params();                     // program the FPGA
//   srv.on_frame([](rocev2::Frame f) { use(f.data(), f.size()); });  // f releases on scope exit
//   srv.complete_connection(fpga_qpn, hp.sq_psn);    // pmtu 5, min_rnr_timer 1
//
// Errors throw rocev2::Error (a std::runtime_error carrying the status and the
// library's message). Frames are move-only loans: the slot is re-posted when
// the Frame is destroyed or release()d, from any thread.
#ifndef ROCEV2_HPP
#define ROCEV2_HPP

#include <array>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "rocev2.h"

namespace rocev2 {

/// The thread's last error message from the library.
inline std::string last_error() {
    std::string s(rocev2_last_error(nullptr, 0) + 1, '\0');
    rocev2_last_error(&s[0], s.size());
    s.resize(s.size() - 1);
    return s;
}

/// A failed library call.
class Error : public std::runtime_error {
  public:
    Error(rocev2_status status, const std::string& msg) : std::runtime_error(msg), status_(status) {}
    rocev2_status status() const noexcept { return status_; }

  private:
    rocev2_status status_;
};

/// Throws Error for any status but ROCEV2_OK.
inline void check(rocev2_status s) {
    if (s != ROCEV2_OK) throw Error(s, last_error());
}

using Gid = std::array<uint8_t, 16>;

/// Parses "10.0.0.1", "::ffff:10.0.0.1" or "0000:...:0a00:0001".
inline Gid parse_gid(const std::string& text) {
    Gid g{};
    check(rocev2_gid_parse(text.c_str(), g.data()));
    return g;
}

/// ibv_devinfo form of a GID.
inline std::string format_gid(const Gid& g) {
    char buf[40];
    check(rocev2_gid_format(g.data(), buf, sizeof buf));
    return buf;
}

/// An open device (rogue's Core). Move-only.
class Device {
  public:
    explicit Device(const std::string& name, uint8_t ib_port = 1, uint8_t gid_index = 0) {
        rocev2_device_config cfg;
        check(rocev2_device_config_init(&cfg, sizeof cfg));
        cfg.name = name.c_str();
        cfg.ib_port = ib_port;
        cfg.gid_index = gid_index;
        check(rocev2_device_open(&cfg, &dev_));
    }
    explicit Device(const rocev2_device_config& cfg) { check(rocev2_device_open(&cfg, &dev_)); }
    Device(Device&& o) noexcept : dev_(std::exchange(o.dev_, nullptr)) {}
    Device& operator=(Device&& o) noexcept {
        if (this != &o) {
            rocev2_device_close(dev_);
            dev_ = std::exchange(o.dev_, nullptr);
        }
        return *this;
    }
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;
    ~Device() { rocev2_device_close(dev_); }
    const rocev2_device* get() const noexcept { return dev_; }

  private:
    rocev2_device* dev_ = nullptr;
};

/// A frame on loan: data() points into the receive slab. Move-only; released
/// (slot re-posted) on destruction or release().
class Frame {
  public:
    Frame() = default;
    Frame(rocev2_server* srv, const rocev2_frame& f) : srv_(srv), f_(f) {}
    Frame(Frame&& o) noexcept : srv_(std::exchange(o.srv_, nullptr)), f_(o.f_) {}
    Frame& operator=(Frame&& o) noexcept {
        if (this != &o) {
            release();
            srv_ = std::exchange(o.srv_, nullptr);
            f_ = o.f_;
        }
        return *this;
    }
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;
    ~Frame() { release(); }

    const uint8_t* data() const noexcept { return f_.data; }
    std::size_t size() const noexcept { return f_.len; }
    uint8_t channel() const noexcept { return static_cast<uint8_t>(f_.channel); }
    uint32_t immediate() const noexcept { return f_.immediate; }
    /// False for a message sent without an immediate (then channel() and
    /// immediate() are 0).
    bool has_immediate() const noexcept { return (f_.flags & ROCEV2_FRAME_HAS_IMMEDIATE) != 0; }
    uint32_t ring_position() const noexcept { return f_.immediate >> 8; }
    uint32_t slot() const noexcept { return f_.slot; }
    /// When the frame's last packet was received: CLOCK_REALTIME ns since
    /// the epoch (since 2.4).
    uint64_t rx_time_ns() const noexcept { return f_.rx_time_ns; }
    /// True when rx_time_ns() is the kernel's receive stamp (soft), false
    /// when it is the NIC's or the host clock at poll (verbs).
    bool rx_time_from_kernel() const noexcept { return (f_.flags & ROCEV2_FRAME_RX_TIME_KERNEL) != 0; }
    /// True when rx_time_ns() is the NIC's completion timestamp on the host
    /// clock (verbs on a device that stamps completions, such as mlx5).
    bool rx_time_from_nic() const noexcept { return (f_.flags & ROCEV2_FRAME_RX_TIME_NIC) != 0; }
    /// Gives up ownership: the caller must pass the token to rocev2_server_release.
    uint64_t detach() noexcept {
        srv_ = nullptr;
        return f_.token;
    }
    /// Releases the loan now (idempotent).
    void release() noexcept {
        if (srv_) rocev2_server_release(std::exchange(srv_, nullptr), f_.token);
    }
    explicit operator bool() const noexcept { return srv_ != nullptr; }

  private:
    rocev2_server* srv_ = nullptr;
    rocev2_frame f_{};
};

/// Server settings with the library's defaults.
inline rocev2_server_config default_server_config() {
    rocev2_server_config c;
    check(rocev2_server_config_init(&c, sizeof c));
    return c;
}

/// The receive server. Move-only; destroyed (stopped) on destruction.
class Server {
  public:
    using Callback = std::function<void(Frame)>;

    explicit Server(const Device& dev, const rocev2_server_config& cfg = default_server_config()) {
        check(rocev2_server_create(dev.get(), &cfg, &srv_));
    }
    Server(Server&& o) noexcept : srv_(std::exchange(o.srv_, nullptr)), cb_(std::move(o.cb_)) {}
    // Note: the callback state holds the server pointer, which does not change on move.
    Server& operator=(Server&&) = delete;
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;
    ~Server() { rocev2_server_destroy(srv_); }

    void set_fpga_gid(const Gid& gid) { check(rocev2_server_set_fpga_gid(srv_, gid.data())); }

    rocev2_host_params host_params() const {
        rocev2_host_params p{};
        p.struct_size = sizeof p;
        check(rocev2_server_get_host_params(srv_, &p));
        return p;
    }

    /// Registers the frame callback (before complete_connection). It runs on
    /// the receive thread; exceptions it throws are caught and reported on
    /// stderr (they cannot cross the C boundary). Do not block in it for
    /// longer than stop_timeout_ms: stop() then detaches the receive thread,
    /// and a callback still running when this Server is destroyed would use a
    /// freed std::function.
    void on_frame(Callback cb) {
        auto state = std::make_unique<CallbackState>(CallbackState{srv_, std::move(cb)});
        check(rocev2_server_register_frame_callback(srv_, &Server::trampoline, state.get()));
        cb_ = std::move(state);
    }

    /// INIT->RTR->RTS and start receiving. fpga_rq_psn: pass host_params().sq_psn.
    void complete_connection(uint32_t fpga_qpn, uint32_t fpga_rq_psn, uint32_t pmtu = ROCEV2_DEFAULT_PMTU,
                             uint32_t min_rnr_timer = ROCEV2_DEFAULT_MIN_RNR_TIMER) {
        check(rocev2_server_complete_connection(srv_, fpga_qpn, fpga_rq_psn, pmtu, min_rnr_timer));
    }

    /// The next frame (pull API, no callback registered), or nothing on timeout.
    std::optional<Frame> poll(std::chrono::milliseconds timeout) {
        rocev2_frame f{};
        f.struct_size = sizeof f;
        rocev2_status s = rocev2_server_poll_frame(srv_, static_cast<int32_t>(timeout.count()), &f);
        if (s == ROCEV2_ERR_TIMEOUT) return std::nullopt;
        check(s);
        return Frame(srv_, f);
    }

    rocev2_stats stats() const {
        rocev2_stats s{};
        s.struct_size = sizeof s;
        check(rocev2_server_get_stats(srv_, &s));
        return s;
    }

    /// Why the link is down ("" while created or connected): the receive
    /// thread's end cause or why complete_connection failed. stats().link_state
    /// says which state (ROCEV2_LINK_*).
    std::string end_cause() const {
        std::string s(rocev2_server_end_cause(srv_, nullptr, 0), '\0');
        if (!s.empty()) rocev2_server_end_cause(srv_, s.data(), s.size() + 1);
        return s;
    }

    bool running() const noexcept { return rocev2_server_is_running(srv_) != 0; }
    void stop() { check(rocev2_server_stop(srv_)); }
    rocev2_server* get() noexcept { return srv_; }

  private:
    struct CallbackState {
        rocev2_server* srv;
        Callback cb;
    };

    static void trampoline(void* user, const rocev2_frame* f) noexcept {
        auto* st = static_cast<CallbackState*>(user);
        try {
            st->cb(Frame(st->srv, *f));
        } catch (const std::exception& e) {
            std::fprintf(stderr, "rocev2: frame callback threw: %s\n", e.what());
        } catch (...) {
            std::fprintf(stderr, "rocev2: frame callback threw an unknown exception\n");
        }
    }

    rocev2_server* srv_ = nullptr;
    std::unique_ptr<CallbackState> cb_;
};

}  // namespace rocev2
#endif  // ROCEV2_HPP
