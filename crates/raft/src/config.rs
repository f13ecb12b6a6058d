//! Configuration of one raft node, validated once into [`ValidConfig`].
//!
//! Tuning (see also the raft-rs facts in the project notes): the election timeout is
//! `tick_interval × election_tick`, randomized per term in `[1, 2)` times that. With
//! `check_quorum`, a leader that hears from no quorum for `election_tick` ticks steps down,
//! so `tick_interval × election_tick` must stay well above the longest stall a follower can
//! have (a GC pause, a slow disk sync, a burst of client work). Turn `check_quorum` off only
//! if followers can stall longer than that and a stale leader for a while is acceptable; keep
//! `pre_vote` on with it, so that a partitioned node does not depose a healthy leader when it
//! comes back.

use std::ops::Deref;
use std::time::Duration;

use crate::error::ConfigError;
use crate::wal::{FsyncPolicy, LogOptions};

/// Settings of one node. Build with `Config::new(id)` and adjust fields, then
/// [`Config::validate`].
#[derive(Clone, Debug)]
pub struct Config {
    /// This node's raft id (not 0).
    pub id: u64,
    /// The explicit initial membership. A node with an empty log that is listed here starts
    /// the cluster with exactly these voters; a node that is not listed (or a list left
    /// empty) waits to be added by the leader and never elects itself alone. Ignored once
    /// the log holds anything.
    pub initial_voters: Vec<u64>,
    /// Period of the raft tick. Default 100 ms.
    pub tick_interval: Duration,
    /// Ticks without a leader before a follower campaigns. Default 10 (1 s).
    pub election_tick: usize,
    /// Ticks between leader heartbeats. Default 2 (200 ms).
    pub heartbeat_tick: usize,
    /// A leader steps down when it has not heard from a quorum for an election timeout.
    /// Default on: a partitioned leader stops serving.
    pub check_quorum: bool,
    /// Campaign only after a pre-vote shows the node could win. Default on.
    pub pre_vote: bool,
    /// Append messages in flight per follower. Default 256.
    pub max_inflight_msgs: usize,
    /// Largest append message in bytes. Default 1 MiB.
    pub max_size_per_msg: u64,
    /// Take a snapshot and compact the log after this many applied entries. Default 10 000.
    pub snapshot_threshold: u64,
    /// Entries applied per actor turn, so that a long backlog never delays raft traffic by
    /// more than one batch. Default 128.
    pub apply_batch_max: usize,
    /// How long a proposal, read or membership change may wait for its outcome. Default 5 s.
    pub request_timeout: Duration,
    /// Requests waiting for an outcome at once; more are refused. Default 10 000.
    pub pending_max: usize,
    /// The write-ahead log (fsync policy, segment size).
    pub log: LogOptions,
    /// Raft messages travel on the mailbox's urgent lane, ahead of client work, and the
    /// driver runs on a thread of its own (`Options::own_thread`), not behind the client
    /// turns ready on a worker. Default on; off only to show what happens without it (the
    /// follower-overload tests).
    pub raft_priority: bool,
    /// Room on the urgent lane for raft messages; beyond it they are dropped (raft
    /// retransmits). Default 1024.
    pub raft_queue_max: usize,
    /// Room on the normal lane for client requests. Default 1024.
    pub client_queue_max: usize,
}

impl Config {
    /// Defaults for node `id`.
    pub fn new(id: u64) -> Self {
        Config {
            id,
            initial_voters: Vec::new(),
            tick_interval: Duration::from_millis(100),
            election_tick: 10,
            heartbeat_tick: 2,
            check_quorum: true,
            pre_vote: true,
            max_inflight_msgs: 256,
            max_size_per_msg: 1 << 20,
            snapshot_threshold: 10_000,
            apply_batch_max: 128,
            request_timeout: Duration::from_secs(5),
            pending_max: 10_000,
            log: LogOptions {
                segment_bytes_max: 64 << 20,
                fsync: FsyncPolicy::Always,
            },
            raft_priority: true,
            raft_queue_max: 1024,
            client_queue_max: 1024,
        }
    }

    /// Checks every field once; the driver accepts only the result.
    pub fn validate(self) -> Result<ValidConfig, ConfigError> {
        if self.id == 0 {
            return Err(ConfigError::ZeroId);
        }
        if self.initial_voters.contains(&0) {
            return Err(ConfigError::ZeroVoter);
        }
        for (field, v) in [
            ("election_tick", self.election_tick as u64),
            ("heartbeat_tick", self.heartbeat_tick as u64),
            ("max_inflight_msgs", self.max_inflight_msgs as u64),
            ("max_size_per_msg", self.max_size_per_msg),
            ("snapshot_threshold", self.snapshot_threshold),
            ("apply_batch_max", self.apply_batch_max as u64),
            ("pending_max", self.pending_max as u64),
            ("segment_bytes_max", self.log.segment_bytes_max),
            ("raft_queue_max", self.raft_queue_max as u64),
            ("client_queue_max", self.client_queue_max as u64),
            ("tick_interval", self.tick_interval.as_micros() as u64),
            ("request_timeout", self.request_timeout.as_micros() as u64),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        if self.heartbeat_tick >= self.election_tick {
            return Err(ConfigError::HeartbeatNotBelowElection {
                heartbeat: self.heartbeat_tick,
                election: self.election_tick,
            });
        }
        Ok(ValidConfig(self))
    }
}

/// A configuration that passed [`Config::validate`].
#[derive(Clone, Debug)]
pub struct ValidConfig(Config);

impl Deref for ValidConfig {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        assert!(Config::new(1).validate().is_ok());
        assert_eq!(Config::new(0).validate().unwrap_err(), ConfigError::ZeroId);
        let mut c = Config::new(1);
        c.heartbeat_tick = 10;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::HeartbeatNotBelowElection { .. })
        ));
        let mut c = Config::new(1);
        c.snapshot_threshold = 0;
        assert_eq!(
            c.validate().unwrap_err(),
            ConfigError::Zero {
                field: "snapshot_threshold"
            }
        );
    }
}
