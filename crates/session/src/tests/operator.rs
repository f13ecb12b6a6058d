//! An operator's subscriptions for the attached client: checked as the client's own,
//! recorded without a SUBACK.

use super::*;

fn qos1() -> SubscriptionOptions {
    SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        ..SubscriptionOptions::default()
    }
}

#[test]
fn an_operators_subscription_is_checked_and_recorded_without_a_suback() {
    let limits = SessionLimits {
        subscriptions_max: 2,
        qos_max: QoS::AtLeastOnce,
        ..SessionLimits::default()
    };
    let mut h = H::attached(limits, &connect(Protocol::V5, "c1", true));
    let filters = vec!["a/#".to_owned(), "b".to_owned(), "c".to_owned()];
    let options = SubscriptionOptions {
        qos: QoS::ExactlyOnce,
        ..SubscriptionOptions::default()
    };
    let checked = h.s.operator_subscribe(filters, options, &mut AllowAll);
    // QoS capped at the broker's maximum; the third is over the quota.
    assert_eq!(checked[0].as_ref().unwrap().options.qos, QoS::AtLeastOnce);
    assert!(checked[1].is_ok());
    assert_eq!(checked[2], Err(ReasonCode::QuotaExceeded));
    assert!(h.s.subscriptions().is_empty(), "recorded only once routed");
    let routed: Vec<_> = checked.into_iter().filter_map(Result::ok).collect();
    h.s.operator_subscribed(
        routed,
        &[Ok(QoS::AtMostOnce), Err(ReasonCode::UnspecifiedError)],
    );
    assert_eq!(
        h.s.subscriptions().keys().collect::<Vec<_>>(),
        vec!["a/#"],
        "the router's refusal is not recorded"
    );
    assert_eq!(h.s.subscriptions()["a/#"].0.qos, QoS::AtMostOnce);
    assert!(h.drain().is_empty(), "no SUBACK for a SUBSCRIBE never sent");

    h.s.operator_unsubscribed(
        &["a/#".to_owned(), "zz".to_owned()],
        &[ReasonCode::Success, ReasonCode::NoSubscriptionExisted],
    );
    assert!(h.s.subscriptions().is_empty());
    assert!(h.drain().is_empty(), "no UNSUBACK either");
}

#[test]
fn an_operators_subscription_meets_the_clients_gate() {
    let h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let checked =
        h.s.operator_subscribe(vec!["secret".to_owned()], qos1(), &mut DenyAll);
    assert_eq!(checked, vec![Err(ReasonCode::NotAuthorized)]);
    let limits = SessionLimits {
        shared_available: false,
        wildcard_available: false,
        ..SessionLimits::default()
    };
    let h = H::attached(limits, &connect(Protocol::V5, "c1", true));
    let checked = h.s.operator_subscribe(
        vec!["$share/g/t".to_owned(), "a/+".to_owned()],
        qos1(),
        &mut AllowAll,
    );
    assert_eq!(
        checked,
        vec![
            Err(ReasonCode::SharedSubscriptionsNotSupported),
            Err(ReasonCode::WildcardSubscriptionsNotSupported)
        ]
    );
}
