//! Rebuild the kernel object when the linker changes (a new nightly means a new bpf-linker).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
