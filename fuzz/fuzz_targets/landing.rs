//! The landing planner: arbitrary learn / discard / plan steps, every plan
//! checked (inside its slot, only posted or partial slots, contiguous).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rocev2::fuzzing::landing_planner(data));
