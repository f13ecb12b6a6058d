//! Matching cost on a trie of 100 000 subscriptions shaped like a device fleet.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use starling_router::{PublishContext, RetainedConfig, RetainedIndex, Router, RouterConfig};

const TENANTS: u32 = 100;
const DEVICES: u32 = 900;

/// 100 tenants × 900 devices each subscribing to its own command topic (90 000), plus per
/// tenant: 50 `+` watchers, 40 `#` auditors and 10 shared workers (10 000).
fn fleet() -> Router<u32, u8> {
    let mut r = Router::new(RouterConfig::default());
    let mut id = 0u32;
    let mut next = || {
        id += 1;
        id
    };
    for t in 0..TENANTS {
        for d in 0..DEVICES {
            r.subscribe(next(), &format!("t{t}/dev/{d}/cmd"), 1)
                .unwrap();
        }
        for _ in 0..50 {
            r.subscribe(next(), &format!("t{t}/dev/+/status"), 0)
                .unwrap();
        }
        for _ in 0..40 {
            r.subscribe(next(), &format!("t{t}/#"), 0).unwrap();
        }
        for _ in 0..10 {
            r.subscribe(next(), &format!("$share/workers/t{t}/dev/+/telemetry"), 1)
                .unwrap();
        }
    }
    assert_eq!(r.subscription_count(), 100_000);
    r
}

fn bench_route(c: &mut Criterion) {
    let mut r = fleet();
    let ctx = PublishContext::default();
    let mut out = Vec::with_capacity(128);
    let mut group = c.benchmark_group("route_100k");
    group.bench_function("command_one_device", |b| {
        b.iter(|| {
            out.clear();
            r.route(black_box("t42/dev/417/cmd"), &ctx, |_| true, &mut out);
            black_box(out.len())
        })
    });
    group.bench_function("status_fanout_90", |b| {
        b.iter(|| {
            out.clear();
            r.route(black_box("t42/dev/417/status"), &ctx, |_| true, &mut out);
            black_box(out.len())
        })
    });
    group.bench_function("telemetry_shared", |b| {
        b.iter(|| {
            out.clear();
            r.route(black_box("t42/dev/417/telemetry"), &ctx, |_| true, &mut out);
            black_box(out.len())
        })
    });
    group.bench_function("miss", |b| {
        b.iter(|| {
            out.clear();
            r.route(black_box("other/dev/417/cmd"), &ctx, |_| true, &mut out);
            black_box(out.len())
        })
    });
    group.finish();
}

fn bench_retained(c: &mut Criterion) {
    let mut idx = RetainedIndex::new(RetainedConfig::default());
    for t in 0..TENANTS {
        for d in 0..DEVICES {
            idx.retain(&format!("t{t}/dev/{d}/status"), d, 8).unwrap();
        }
    }
    let mut group = c.benchmark_group("retained_90k");
    group.bench_function("one_tenant_statuses", |b| {
        b.iter(|| black_box(idx.matching(black_box("t42/dev/+/status")).unwrap().count()))
    });
    group.bench_function("exact_topic", |b| {
        b.iter(|| {
            black_box(
                idx.matching(black_box("t42/dev/417/status"))
                    .unwrap()
                    .count(),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bench_route, bench_retained);
criterion_main!(benches);
