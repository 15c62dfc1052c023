//! The portable `emu` backend (unicorn-engine).
