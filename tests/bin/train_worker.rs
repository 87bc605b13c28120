//! `tessera train` as a process of the test crate (the preemption test in
//! `tests/it/graph_runtime/train.rs` signals it): the same arguments, the same code.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(tooling::train::cli(&args));
}
