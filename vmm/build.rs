//! `cfg(emu)` for the emu backend's features, and the link settings of the
//! test-only `hvf-sim` and `hvf-abi-probe` features (see `Cargo.toml`).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(emu)");
    let feature = |name: &str| std::env::var_os(format!("CARGO_FEATURE_{name}")).is_some();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    // `emu` on any host; the default `emu-on-linux` only where its
    // dependency (declared for Linux alone) is built.
    if feature("EMU") || (feature("EMU_ON_LINUX") && os == "linux") {
        println!("cargo::rustc-cfg=emu");
    }
    let sim = feature("HVF_SIM") || feature("HVF_ABI_PROBE");
    if sim && os != "macos" {
        // The hvf backend looks up newer framework symbols at run time
        // (`dlsym(RTLD_DEFAULT)`); the stand-ins are in the executable, where
        // dlsym finds only what is in its dynamic symbol table. Only them:
        // `-rdynamic` would keep every function of applevisor, including
        // those calling framework functions the backend never uses, which
        // the simulator does not have.
        println!("cargo::rustc-link-arg=-Wl,--export-dynamic-symbol=hv_*");
    }
}
