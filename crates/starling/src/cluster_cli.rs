//! `starling cluster status`: the cluster as the node `--config` names sees it, through that
//! node's HTTP API (`GET /api/v1/cluster`, with its `[http]` bind and bearer token). Whether
//! each member is heard is known only to the leader, so a follower's answer is completed
//! with the leader's (through the leader's own API address, with the same token).
//! `starling cluster join ADDR` adds the node `--config` names to the cluster of the member
//! whose API is at ADDR (the leader does it: a follower's answer names it, and the request
//! goes there); `starling cluster leave` has the node `--config` names leave, after which it
//! stops. Every node of a cluster is taken to share one bearer token.

use std::net::SocketAddr;

use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::{json, Value};
use starling_config::{Config, HttpConfig};

use crate::ctl::{get_json, ok, request, request_within};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Lists the members, their health and the leader.
    Status {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Adds the node that --config names (started with `cluster.bootstrap = false`) to the
    /// cluster of the member whose HTTP API is at ADDR; returns once it is a voter.
    Join {
        /// The HTTP API address (`host:port`) of any member of the cluster.
        addr: SocketAddr,
    },
    /// Has the node that --config names leave its cluster: its clients are sent to the
    /// other nodes (0x9C Use another server) and given --drain-secs to take their sessions
    /// there; the node then leaves and stops.
    Leave {
        /// How long the clients have to reconnect elsewhere, their sessions following them.
        #[arg(long, default_value_t = 30)]
        drain_secs: u32,
    },
}

/// How many times a join follows a "not the leader" answer (to the leader it names, or
/// after a pause when it names none), and the pause.
const LEADER_TRIES: usize = 20;
const LEADER_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

pub fn run(config: &Config, command: &ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Join { addr } => return join(config, *addr),
        ClusterCommand::Leave { drain_secs } => return leave(config, *drain_secs),
        ClusterCommand::Status { json } => {
            let mut st = get_json(&config.http, "/cluster")?;
            if st["enabled"] == false {
                if *json {
                    println!("{st}");
                } else {
                    println!(
                        "node {} is not in a cluster (cluster.enabled is false)",
                        st["node"]
                    );
                }
                return Ok(());
            }
            let leader = st["leader"].as_u64();
            if st["role"] != "leader" {
                let leader_http = st["members"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["id"].as_u64() == leader)
                    .and_then(|m| m["http"].as_str())
                    .and_then(|a| a.parse().ok());
                if let Some(bind) = leader_http {
                    let http = HttpConfig {
                        bind,
                        ..config.http.clone()
                    };
                    // Best effort: without the leader's view, health stays unknown.
                    if let Ok(l) = get_json(&http, "/cluster") {
                        merge_health(&mut st, &l);
                    }
                }
            }
            if *json {
                println!("{st}");
            } else {
                print!("{}", table(&st).context("the cluster status")?);
            }
        }
    }
    Ok(())
}

/// The API of the node at `bind`, with the token of `config`.
fn api_at(config: &Config, bind: SocketAddr) -> HttpConfig {
    HttpConfig {
        bind,
        ..config.http.clone()
    }
}

fn join(config: &Config, addr: SocketAddr) -> anyhow::Result<()> {
    let me = get_json(&config.http, "/cluster").context("the node to add (--config)")?;
    if me["enabled"] == false {
        bail!(
            "node {} is not in a cluster: set cluster.enabled = true (and bootstrap = false) in its config",
            me["node"]
        );
    }
    let id = me["node"].as_u64().context("the node's id")?;
    let this = &me["self"];
    let body = json!({
        "id": id,
        "mqtt": this["mqtt"],
        "cluster": this["cluster"],
        "http": this["http"],
    });
    let mut at = addr;
    for _ in 0..LEADER_TRIES {
        let (status, answer) = request(
            &api_at(config, at),
            "POST",
            "/cluster/members",
            Some(&body.to_string()),
        )
        .with_context(|| format!("the member at {at}"))?;
        if status == 409 {
            match leader_api(&answer) {
                // Not the leader: ask the one it names.
                Some(Some(leader)) => {
                    at = leader;
                    continue;
                }
                // No leader known there yet, or not its address (an election, a record
                // not applied yet): ask again shortly.
                Some(None) => {
                    std::thread::sleep(LEADER_RETRY);
                    continue;
                }
                None => {}
            }
        }
        ok(status, answer).with_context(|| format!("adding node {id} through {at}"))?;
        println!("node {id} joined the cluster (through the leader's API at {at})");
        return Ok(());
    }
    bail!(
        "no leader took the request after {LEADER_TRIES} tries (an election under way?); try again"
    )
}

fn leave(config: &Config, drain_secs: u32) -> anyhow::Result<()> {
    let path = format!("/cluster/leave?drain_secs={drain_secs}");
    let wait = std::time::Duration::from_secs(u64::from(drain_secs) + 60);
    let (status, answer) = request_within(&config.http, "POST", &path, None, wait)
        .context("the node to remove (--config)")?;
    let v: Value = serde_json::from_str(&ok(status, answer)?).context("the answer")?;
    println!(
        "node {} left the cluster and is stopping; {} sessions did not move and end with it",
        v["left"], v["sessions_left_behind"]
    );
    // Absent from an older node's answer.
    let (messages, relays) = (
        v["messages_left_behind"].as_u64().unwrap_or(0),
        v["relays_left_behind"].as_u64().unwrap_or(0),
    );
    if messages > 0 || relays > 0 {
        println!(
            "within the drain time the other nodes did not take {messages} messages this node \
             owed them, and {relays} sessions that moved away could still be sent copies here: \
             those are lost (a node it could not reach? see its log)"
        );
    }
    Ok(())
}

/// In a "not the leader" answer, the leader's API address if it names one (`None` in the
/// outer option: not such an answer).
fn leader_api(answer: &str) -> Option<Option<SocketAddr>> {
    let v: Value = serde_json::from_str(answer).ok()?;
    v.get("leader")?;
    Some(v["leader_http"].as_str().and_then(|a| a.parse().ok()))
}

/// Copies the leader's `active` and `matched` of each member into `st`.
fn merge_health(st: &mut Value, leader: &Value) {
    let Some(theirs) = leader["members"].as_array() else {
        return;
    };
    if let Some(ours) = st["members"].as_array_mut() {
        for m in ours {
            if let Some(t) = theirs.iter().find(|t| t["id"] == m["id"]) {
                m["active"] = t["active"].clone();
                m["matched"] = t["matched"].clone();
            }
        }
    }
}

fn table(st: &Value) -> Option<String> {
    let leader = st["leader"].as_u64();
    let mut out = format!(
        "node {} is {}, term {}, leader {}, commit {}, applied {}\n",
        st["node"].as_u64()?,
        st["role"].as_str()?,
        st["term"].as_u64()?,
        leader.map_or("none".to_owned(), |l| l.to_string()),
        st["commit"].as_u64()?,
        st["applied"].as_u64()?,
    );
    out.push_str(&format!(
        "{:>4}  {:<8}  {:<22}  {:<22}  {:<7}  {}\n",
        "id", "role", "mqtt", "cluster", "health", "matched"
    ));
    for m in st["members"].as_array()? {
        let id = m["id"].as_u64()?;
        let role = if Some(id) == leader {
            "leader"
        } else if m["voter"].as_bool() == Some(true) {
            "voter"
        } else {
            "learner"
        };
        let health = match m["active"].as_bool() {
            Some(true) => "up",
            Some(false) => "down",
            None => "unknown",
        };
        out.push_str(&format!(
            "{:>4}  {:<8}  {:<22}  {:<22}  {:<7}  {}\n",
            id,
            role,
            m["mqtt"].as_str().unwrap_or("-"),
            m["cluster"].as_str().unwrap_or("-"),
            health,
            m["matched"]
                .as_u64()
                .map_or("-".to_owned(), |n| n.to_string()),
        ));
    }
    out.push_str(&format!(
        "routes: {} filters; this node's subscriptions all routed: {}\n",
        st["routes"].as_u64()?,
        if st["routes_converged"].as_bool()? {
            "yes"
        } else {
            "not yet"
        }
    ));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_not_the_leader_answer_names_the_leader_to_ask_or_none() {
        let named = r#"{"code":409,"message":"x","leader":1,"leader_http":"127.0.0.1:6061"}"#;
        assert_eq!(
            leader_api(named),
            Some(Some("127.0.0.1:6061".parse().unwrap()))
        );
        let unknown = r#"{"code":409,"message":"x","leader":null,"leader_http":null}"#;
        assert_eq!(leader_api(unknown), Some(None));
        let other = r#"{"code":409,"message":"this node is not in a cluster"}"#;
        assert_eq!(leader_api(other), None);
    }

    #[test]
    fn the_table_names_the_leader_and_each_members_health() {
        let st = serde_json::json!({
            "node": 2, "role": "follower", "term": 4, "leader": 1, "commit": 9, "applied": 9,
            "routes": 3, "routes_converged": true,
            "members": [
                {"id": 1, "mqtt": "127.0.0.1:1883", "cluster": "127.0.0.1:7001", "voter": true, "active": null, "matched": null},
                {"id": 2, "mqtt": "127.0.0.1:1884", "cluster": "127.0.0.1:7002", "voter": true, "active": null, "matched": null},
            ]
        });
        let mut st2 = st.clone();
        let leader = serde_json::json!({"members": [
            {"id": 1, "active": true, "matched": 9}, {"id": 2, "active": false, "matched": 7}
        ]});
        merge_health(&mut st2, &leader);
        let t = table(&st2).unwrap();
        assert!(t.starts_with("node 2 is follower, term 4, leader 1"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.contains("leader") && l.contains(" up ")),
            "{t}"
        );
        assert!(
            t.lines()
                .any(|l| l.trim_start().starts_with('2') && l.contains("down")),
            "{t}"
        );
        assert!(table(&st).unwrap().contains("unknown"));
    }
}
