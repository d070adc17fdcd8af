//! fencegate-bench: placeholder, replaced by the benchmark suite.

fn main() {
    println!("fencegate-bench");
}
