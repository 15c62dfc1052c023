//! Link settings of the test-only `hvf-sim` and `hvf-abi-probe` features
//! (see `Cargo.toml`).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let sim = std::env::var_os("CARGO_FEATURE_HVF_SIM").is_some()
        || std::env::var_os("CARGO_FEATURE_HVF_ABI_PROBE").is_some();
    let macos = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "macos");
    if sim && !macos {
        // The hvf backend looks up newer framework symbols at run time
        // (`dlsym(RTLD_DEFAULT)`); the stand-ins are in the executable, where
        // dlsym finds only what is in its dynamic symbol table. Only them:
        // `-rdynamic` would keep every function of applevisor, including
        // those calling framework functions the backend never uses, which
        // the simulator does not have.
        println!("cargo::rustc-link-arg=-Wl,--export-dynamic-symbol=hv_*");
    }
}
