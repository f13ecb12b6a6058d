//! `starling cluster status`: the cluster as the node `--config` names sees it, through that
//! node's HTTP API (`GET /api/v1/cluster`, with its `[http]` bind and bearer token). Whether
//! each member is heard is known only to the leader, so a follower's answer is completed
//! with the leader's (through the leader's own API address, with the same token).

use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;
use starling_config::{Config, HttpConfig};

use crate::ctl::get_json;

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Lists the members, their health and the leader.
    Status {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(config: &Config, command: &ClusterCommand) -> anyhow::Result<()> {
    match command {
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
