//! Measures an idle actor's memory and a message hop's CPU cost on the madsim backend.
//! `cd sim && cargo run --release --example actor_cost [actors] [hops]`

fn main() {
    let mut args = std::env::args().skip(1);
    let idle = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let hops = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let c =
        madsim::runtime::Runtime::new().block_on(starling_rt::testkit::measure_costs(idle, hops));
    println!("{c:?}");
}
