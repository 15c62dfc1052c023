//! Compiles the C stand-ins for aarch64 Linux only (elsewhere the crate is
//! empty): the C compiler, not this crate, decides where each argument goes.

fn main() {
    println!("cargo::rerun-if-changed=c");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if arch == "aarch64" && os == "linux" {
        cc::Build::new()
            .file("c/standins.c")
            .file("c/simd_setter.S")
            .opt_level(2)
            .warnings_into_errors(true)
            .compile("hvf_abi_probe");
    }
}
