//! The runtime's behavioural suite on the madsim backend, each case on the default seed
//! range (the actix run is `crates/rt/tests/behaviour.rs`).

use starling_rt::testkit;
use starling_sim::{run, RunConfig};

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run(RunConfig::new("rt_behaviour", stringify!($name)), testkit::$name);
            }
        )*

        #[test]
        fn suite_covers_every_testkit_case() {
            let here: &[&str] = &[$(stringify!($name)),*];
            assert_eq!(here, testkit::ALL);
        }
    };
}

suite!(
    request_reply,
    per_sender_ordering,
    back_pressure_when_mailbox_full,
    urgent_lane_overtakes_normal,
    timers_fire_once_periodically_and_cancel,
    input_stream_consumed_beside_mailbox,
    own_input_alternates_with_mailbox,
    stop_runs_stopped_hook_and_reports_exit,
    idle_actor_stops_when_last_address_dropped,
    supervisor_learns_child_stop_and_panic,
    parent_stop_stops_children,
    send_to_stopped_actor_fails,
    blocking_pool_refuses_when_full_and_survives_a_panic,
);
