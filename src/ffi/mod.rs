//! C API (in progress)
