//! The nemesis: injects partitions (whole node, one link, one-way), kill and restart,
//! message delay and follower overload into a [`Cluster`], one fault at a time, each fault
//! reverted before the next. Every action is drawn from the simulation's seeded RNG.

use std::fmt;
use std::time::Duration;

use madsim::net::NetSim;
use madsim::rand::{thread_rng, Rng};

use crate::cluster::Cluster;
use crate::knobs::Knobs;

/// One fault. [`Nemesis::apply`] injects it and [`Nemesis::revert`] takes it back, so a
/// regression scenario can replay a schedule explicitly.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Node cut off from everyone, both ways (isolates a leader, or makes a minority).
    Isolate(usize),
    /// Traffic between two nodes dropped both ways.
    Link(usize, usize),
    /// These nodes cut off from the others both ways, still linked among themselves: a
    /// minority of more than one node (two of five), which can talk but not commit.
    Split(Vec<usize>),
    /// Traffic from the first node to the second dropped; the other way works.
    OneWay(usize, usize),
    /// Node crash-stopped, restarted when the fault is reverted.
    Kill(usize),
    /// Every packet delayed by a latency drawn from this range.
    Delay(Duration, Duration),
    /// Node slowed: paused for `busy` out of every `busy + idle`, as a node whose actors are
    /// swamped answers late. Reverted by resuming it.
    Overload {
        node: usize,
        busy: Duration,
        idle: Duration,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Isolate(n) => write!(f, "isolate node{n}"),
            Fault::Link(a, b) => write!(f, "cut node{a}<->node{b}"),
            Fault::Split(side) => {
                let names: Vec<String> = side.iter().map(|n| format!("node{n}")).collect();
                write!(f, "split {{{}}} from the rest", names.join(","))
            }
            Fault::OneWay(a, b) => write!(f, "cut node{a}->node{b}"),
            Fault::Kill(n) => write!(f, "kill node{n}"),
            Fault::Delay(a, b) => write!(f, "delay {a:?}..{b:?}"),
            Fault::Overload { node, busy, idle } => {
                write!(f, "overload node{node} busy={busy:?} idle={idle:?}")
            }
        }
    }
}

/// A record of what the nemesis did and when (virtual time).
#[derive(Clone, Debug)]
pub struct Record {
    pub at: Duration,
    pub fault: Fault,
    pub lasted: Duration,
}

/// Drives faults during a chaos phase.
pub struct Nemesis {
    knobs: Knobs,
    pub history: Vec<Record>,
}

impl Nemesis {
    pub fn new(knobs: Knobs) -> Self {
        Nemesis {
            knobs,
            history: Vec::new(),
        }
    }

    /// Draws the next fault for a cluster of `n` nodes.
    pub fn draw(&self, n: usize) -> Fault {
        let mut r = thread_rng();
        let p: f64 = r.gen_range(0.0..1.0);
        let a = r.gen_range(0..n);
        let b = (a + r.gen_range(1..n.max(2))) % n;
        if p < self.knobs.kill_ratio {
            Fault::Kill(a)
        } else if p < self.knobs.kill_ratio + self.knobs.overload_ratio {
            Fault::Overload {
                node: a,
                busy: Duration::from_millis(r.gen_range(50..400)),
                idle: Duration::from_millis(r.gen_range(10..100)),
            }
        } else {
            match r.gen_range(0..4) {
                0 => Fault::Isolate(a),
                1 => Fault::Link(a, b),
                2 => Fault::OneWay(a, b),
                _ => {
                    let lo = r.gen_range(1..50);
                    Fault::Delay(
                        Duration::from_millis(lo),
                        Duration::from_millis(lo + r.gen_range(1..300)),
                    )
                }
            }
        }
    }

    /// Injects `fault`.
    pub fn apply(cluster: &Cluster, fault: &Fault) {
        match *fault {
            Fault::Isolate(n) => cluster.isolate(n),
            Fault::Link(a, b) => cluster.clog_link(a, b),
            Fault::Split(ref side) => {
                for &a in side {
                    for b in (0..cluster.len()).filter(|b| !side.contains(b)) {
                        cluster.clog_link(a, b);
                    }
                }
            }
            Fault::OneWay(a, b) => cluster.clog_one_way(a, b),
            Fault::Kill(n) => cluster.kill(n),
            Fault::Delay(lo, hi) => NetSim::current()
                .update_config(|c| c.send_latency = lo..hi.max(lo + Duration::from_nanos(1))),
            // Applied as a duty cycle by `hold`.
            Fault::Overload { .. } => {}
        }
    }

    /// Takes `fault` back: heals, restarts, resumes.
    pub fn revert(cluster: &Cluster, fault: &Fault, knobs: &Knobs) {
        match *fault {
            Fault::Isolate(_) | Fault::Link(..) | Fault::Split(_) | Fault::OneWay(..) => {
                cluster.heal_network()
            }
            Fault::Kill(n) => cluster.restart(n),
            Fault::Delay(..) => NetSim::current().update_config(|c| {
                c.send_latency = knobs.latency.0
                    ..knobs
                        .latency
                        .1
                        .max(knobs.latency.0 + Duration::from_nanos(1))
            }),
            Fault::Overload { node, .. } => cluster.resume(node),
        }
    }

    /// Keeps `fault` in force for `d` (for an overload, runs its pause/resume cycle).
    pub async fn hold(cluster: &Cluster, fault: &Fault, d: Duration) {
        match *fault {
            Fault::Overload { node, busy, idle } => {
                let end = madsim::time::Instant::now() + d;
                while madsim::time::Instant::now() < end {
                    cluster.pause(node);
                    madsim::time::sleep(busy).await;
                    cluster.resume(node);
                    madsim::time::sleep(idle).await;
                }
            }
            _ => madsim::time::sleep(d).await,
        }
    }

    /// Runs the chaos phase: faults one after the other for `knobs.chaos`, then heals all.
    pub async fn chaos(&mut self, cluster: &Cluster) {
        let k = self.knobs.clone();
        NetSim::current().update_config(|c| {
            c.send_latency = k.latency.0..k.latency.1.max(k.latency.0 + Duration::from_nanos(1))
        });
        let end = madsim::time::Instant::now() + k.chaos;
        while madsim::time::Instant::now() < end {
            let fault = self.draw(cluster.len());
            let lasted = {
                let mut r = thread_rng();
                let base = k.fault_every.as_millis() as u64;
                Duration::from_millis(r.gen_range(base / 2..base * 2 + 1))
            };
            let calm = Duration::from_millis(
                thread_rng().gen_range(0..k.fault_every.as_millis() as u64 + 1),
            );
            self.history.push(Record {
                at: crate::elapsed(),
                fault: fault.clone(),
                lasted,
            });
            tracing::info!(at = ?crate::elapsed(), %fault, ?lasted, "nemesis");
            Self::apply(cluster, &fault);
            Self::hold(cluster, &fault, lasted).await;
            Self::revert(cluster, &fault, &k);
            madsim::time::sleep(calm).await;
        }
        Self::heal(cluster, &k);
    }

    /// Removes every fault: network healed, latency back to the knobs' range, all nodes
    /// resumed.
    pub fn heal(cluster: &Cluster, knobs: &Knobs) {
        cluster.heal_network();
        NetSim::current().update_config(|c| {
            c.send_latency = knobs.latency.0
                ..knobs
                    .latency
                    .1
                    .max(knobs.latency.0 + Duration::from_nanos(1))
        });
        for i in 0..cluster.len() {
            cluster.resume(i);
        }
    }

    /// The fault schedule as text, one line per fault (for failure reports).
    pub fn schedule(&self) -> String {
        self.history
            .iter()
            .map(|r| format!("  at {:?}: {} for {:?}", r.at, r.fault, r.lasted))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
