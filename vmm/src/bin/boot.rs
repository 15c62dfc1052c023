//! `boot`: runs an aarch64 Linux guest.

fn main() {
    eprintln!("boot: not implemented yet");
    std::process::exit(1);
}
