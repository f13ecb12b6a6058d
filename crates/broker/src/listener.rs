//! The listener actor (accept loop) and the CONNECT handshake each accepted connection runs
//! in its own task before it is handed to the registry.
//!
//! Everything here runs for peers that have not authenticated, so every resource it spends
//! is bounded: bytes of CONNECT buffered (`max_connect_packet_size` per connection,
//! `connect_read_budget_bytes` per listener), password verifications (a bounded pool off
//! the connection threads, and bans of addresses that keep failing), and log lines (one per
//! [`LOG_EVERY`] per listener and kind of event).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rand::RngCore;
use starling_codec::{
    decode_connect, peek_protocol, Connect, Error as CodecError, Protocol, ReasonCode,
};
use starling_config::ListenerConfig;
use starling_hooks::{
    AuthnPolicy, Chain, ConnectRequest, Event, EventKind, Identity, Refusal, Subject, What,
};
use starling_net::{
    CapRelease, ConnInfo, ListenerCounters, MqttListener, NetError, PendingConnection,
};
use starling_rt::throttle::Throttle;
use starling_rt::{rng, time, Actor, Addr, Ctx};
use starling_session::{check_connect, ClientIdentity};
use tokio::io::AsyncReadExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn, Instrument};

use crate::conn::Io;
use crate::metrics::add;
use crate::msg::{NewConn, RegistryMsg};
use crate::refuse::refuse;
use crate::settings::Shared;

/// Peer-caused events (bad handshakes, malformed CONNECTs, failed logins) are logged at
/// info at most once per this, per listener and kind, with the count held back.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// The first read buffer of a connection. A CONNECT is typically well under this; one
/// declaring more reserves its size from the listener's read budget before it is buffered.
const FIRST_READ: usize = 256;

/// What every connection of one listener needs.
pub(crate) struct ListenerCtx {
    pub shared: Arc<Shared>,
    pub registry: Addr<RegistryMsg>,
    /// The hook chain: authentication, and the connect/connack events.
    pub chain: Arc<Chain>,
    /// What decides a CONNECT every authenticator ignores.
    pub policy: AuthnPolicy,
    /// Seconds from accept to a complete CONNECT.
    pub connect_timeout: Duration,
    /// max_connections: one permit per open connection.
    pub connections: Arc<Semaphore>,
    /// Whether the TLS client certificate's CN is the username.
    pub cn_as_username: bool,
    /// Largest CONNECT read before authentication, whole packet.
    pub max_connect: u32,
    /// connect_read_budget_bytes: one permit per byte of CONNECT being buffered.
    pub connect_budget: Arc<Semaphore>,
    /// The listener's transport counters (CONNECT timeouts are counted here too).
    pub counters: Arc<ListenerCounters>,
    /// Rate limits of the info lines peers can cause on this listener.
    pub log_refused: Throttle,
    pub log_logins: Throttle,
}

impl ListenerCtx {
    /// The context of a listener configured as `lc`.
    pub(crate) fn new(
        shared: &Arc<Shared>,
        registry: Addr<RegistryMsg>,
        lc: &ListenerConfig,
        counters: Arc<ListenerCounters>,
        chain: Arc<Chain>,
    ) -> Self {
        let max_connect = lc
            .max_connect_packet_size
            .min(shared.config.mqtt.max_packet_size);
        let budget = usize::try_from(lc.connect_read_budget_bytes)
            .unwrap_or(usize::MAX)
            .clamp(max_connect as usize, Semaphore::MAX_PERMITS);
        Self {
            shared: shared.clone(),
            registry,
            chain,
            policy: AuthnPolicy {
                allow_anonymous: lc.allow_anonymous,
            },
            connect_timeout: Duration::from_secs(u64::from(lc.handshake_timeout_secs.max(1))),
            connections: Arc::new(Semaphore::new(
                (lc.max_connections as usize).clamp(1, Semaphore::MAX_PERMITS),
            )),
            cn_as_username: lc.tls.as_ref().is_some_and(|t| t.cn_as_username),
            max_connect,
            connect_budget: Arc::new(Semaphore::new(budget)),
            counters,
            log_refused: Throttle::new(LOG_EVERY),
            log_logins: Throttle::new(LOG_EVERY),
        }
    }
}

pub(crate) enum ListenerMsg {
    Accepted(Result<PendingConnection, NetError>),
}

pub(crate) struct ListenerActor {
    listener: Option<MqttListener>,
    ctx: Arc<ListenerCtx>,
}

impl ListenerActor {
    pub(crate) fn new(listener: MqttListener, ctx: ListenerCtx) -> Self {
        Self {
            listener: Some(listener),
            ctx: Arc::new(ctx),
        }
    }
}

impl Actor for ListenerActor {
    type Msg = ListenerMsg;

    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        // The accept loop is the actor's input: one accepted connection per item. It waits
        // while `max_handshakes` transport handshakes run (`MqttListener::accept`), so a storm
        // of TLS handshakes waits in the kernel's accept queue, not in memory.
        let accepts = futures::stream::unfold(listener, |l| async move {
            let r = l.accept().await;
            Some((ListenerMsg::Accepted(r), l))
        });
        ctx.add_stream(accepts, None);
    }

    async fn handle(&mut self, msg: ListenerMsg, _ctx: &mut Ctx<Self>) {
        match msg {
            ListenerMsg::Accepted(Ok(pending)) => {
                let peer = pending.transport_peer();
                let Ok(permit) = self.ctx.connections.clone().try_acquire_owned() else {
                    add(&self.ctx.shared.metrics.connections_refused, 1);
                    info!(%peer, "connection refused: max_connections reached");
                    return;
                };
                let lctx = self.ctx.clone();
                // `handshake_timeout_secs` and the handshake latency run from here.
                let accepted = time::now();
                let span = tracing::debug_span!("conn", %peer);
                // Counted while this task runs: it ends when the CONNECT goes to the
                // registry, is refused, or never comes.
                lctx.shared.metrics.handshakings.shift(1);
                starling_rt::spawn(
                    async move {
                        let shared = lctx.shared.clone();
                        // Boxed apart: a TLS or WebSocket handshake's state is kilobytes, and
                        // while it is not running the task should hold only what follows.
                        // Its place under max_handshakes is freed when this returns, before
                        // the CONNECT is read: a client slow to send it must not hold up
                        // other connections (the deadline and the read budget bound it).
                        match Box::pin(pending.handshake()).await {
                            Ok((stream, info)) => {
                                let cap = stream.cap_release();
                                let io = Box::new(stream);
                                Box::pin(serve(io, info, Some(permit), cap, lctx, accepted)).await
                            }
                            Err(e) => {
                                if let Some(suppressed) = lctx.log_refused.admit() {
                                    info!(
                                        %peer,
                                        error = %e,
                                        suppressed,
                                        "transport handshake failed"
                                    );
                                }
                            }
                        }
                        shared.metrics.handshakings.shift(-1);
                    }
                    .instrument(span),
                );
            }
            ListenerMsg::Accepted(Err(e)) => {
                // Per-connection accept failures (out of descriptors...) are transient.
                warn!(error = %e, "accept failed");
                time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Why a connection ended before its CONNECT was accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("no CONNECT within {0:?}")]
    Timeout(Duration),
    #[error("connection closed before CONNECT")]
    Closed,
    #[error("malformed CONNECT: {0}")]
    Codec(#[from] CodecError),
}

/// Runs the CONNECT handshake on a stream accepted at `accepted` and hands the connection
/// to the registry: reads the CONNECT (within `handshake_timeout_secs` of `accepted`, the
/// listener's CONNECT size and read budget), authenticates, checks it against the session
/// limits, assigns a client id if needed. Refusals get their CONNACK.
pub(crate) async fn serve(
    mut io: Box<dyn Io>,
    info: ConnInfo,
    permit: Option<OwnedSemaphorePermit>,
    cap: Option<CapRelease>,
    lctx: Arc<ListenerCtx>,
    accepted: time::Instant,
) {
    let shared = &lctx.shared;
    // `handshake_timeout_secs` runs across the transport handshake and the CONNECT read.
    let deadline = accepted + lctx.connect_timeout;
    // A refusal's CONNACK written: the handshake latency, as for an accepted connection.
    let timed = || shared.metrics.connack_written(info.kind, accepted);
    let mut buf = BytesMut::with_capacity(FIRST_READ);
    let left = deadline.saturating_duration_since(time::now());
    let read = time::timeout(left, read_connect(&mut io, &mut buf, &lctx)).await;
    let result = match read {
        None => Err(ConnectError::Timeout(lctx.connect_timeout)),
        Some(r) => r,
    };
    let (mut connect, budget) = match result {
        Ok(c) => c,
        Err(e) => {
            add(&shared.metrics.connections_refused, 1);
            match &e {
                ConnectError::Timeout(_) => {
                    lctx.counters.record_connect_timeout();
                    add(&shared.metrics.rmqtt.client_handshaking_timeout, 1);
                    debug!(error = %e, "connection closed before session");
                }
                ConnectError::Closed => debug!(error = %e, "connection closed before session"),
                ConnectError::Codec(_) => {
                    // Garbage where a CONNECT belongs (any transport): worth an operator's
                    // eye, but peers send it at will, so rate-limited.
                    if let Some(suppressed) = lctx.log_refused.admit() {
                        info!(
                            listener = %info.kind,
                            peer = %info.peer,
                            error = %e,
                            suppressed,
                            "connection refused: malformed CONNECT"
                        );
                    }
                }
            }
            if let ConnectError::Codec(ce) = &e {
                refuse_malformed(&mut io, &mut buf, ce, left, timed).await;
            }
            return;
        }
    };
    // Counted from the CONNECT read to the verdict: the part of a handshake the broker,
    // not the peer, is working on.
    shared.metrics.handshakings_active.shift(1);
    let admitted = admit(&lctx, &info, &mut io, &mut connect, budget, deadline, timed).await;
    shared.metrics.handshakings_active.shift(-1);
    let Some((client_id, username)) = admitted else {
        return;
    };
    // Authenticated and within the limits: the transport may buffer what the session's
    // limits allow (a WebSocket message up to the largest packet, a QUIC stream's window)
    // from now on.
    if let Some(cap) = cap {
        cap.release();
    }
    // An assigned id leaves `connect.client_id` empty: the session announces it in CONNACK.
    let conn = Box::new(NewConn {
        connect,
        io,
        buf,
        peer: info.peer,
        username,
        permit,
        accepted,
        listener: info.kind,
    });
    let _ = lctx
        .registry
        .send(RegistryMsg::Connect { client_id, conn })
        .await;
}

/// Decides a read CONNECT: authentication, then the session limits and the client id.
/// `None` when it was refused (its CONNACK written); else the client id and the username.
async fn admit(
    lctx: &ListenerCtx,
    info: &ConnInfo,
    io: &mut Box<dyn Io>,
    connect: &mut Connect,
    budget: Option<OwnedSemaphorePermit>,
    deadline: time::Instant,
    timed: impl FnOnce(),
) -> Option<(Arc<str>, Option<String>)> {
    let shared = &lctx.shared;
    connect_event(lctx, connect, info, None);
    let password = connect.password.take();
    let by_certificate = lctx.cn_as_username && info.tls_client_cn.is_some();
    // RMQTT's anonymous login: a CONNECT with no username (here, nor one its certificate
    // gives), counted at CONNECT whatever the verdict.
    let anonymous = connect.username.is_none() && !by_certificate;
    {
        let r = &shared.metrics.rmqtt;
        add(&r.client_connect, 1);
        add(&r.client_authenticate, 1);
        if anonymous {
            add(&r.client_auth_anonymous, 1);
        }
    }
    let verdict = if by_certificate {
        // The verified certificate is the credential, and its CN the username.
        Ok(Identity::new(info.tls_client_cn.clone()))
    } else {
        let left = deadline.saturating_duration_since(time::now());
        authenticate(lctx, info, connect, password.as_ref(), left).await
    };
    // The CONNECT is decoded and authenticated: its bytes no longer count as unauthenticated.
    drop(budget);
    let username = match verdict {
        Ok(id) => id.username,
        Err(code) => {
            add(&shared.metrics.connections_refused, 1);
            shared.metrics.rmqtt.connack(code, anonymous);
            debug!(?code, "CONNECT refused by authentication");
            connect_event(lctx, connect, info, Some(code));
            refuse(io, connect.protocol, code, timed).await;
            return None;
        }
    };
    let client_id: Arc<str> = match check_connect(connect, &shared.limits) {
        Ok(ClientIdentity::Given) => Arc::from(connect.client_id.as_str()),
        Ok(ClientIdentity::MustAssign) => Arc::from(assign_client_id()),
        Err(code) => {
            add(&shared.metrics.connections_refused, 1);
            shared.metrics.rmqtt.connack(code, anonymous);
            debug!(?code, "CONNECT refused");
            connect_event(lctx, connect, info, Some(code));
            refuse(io, connect.protocol, code, timed).await;
            return None;
        }
    };
    Some((client_id, username))
}

/// Decides a CONNECT's credentials through the hook chain: `Err` is the CONNACK code to
/// refuse with. A verdict that is not ready (the password file's verification, on its
/// pool) is awaited here, in the connection's own task, until the handshake deadline
/// (`left`); one that misses it is refused with Server unavailable (MQTT 5 §3.2.2.2 0x88;
/// 3.x return code 3), which tells the client to retry later.
async fn authenticate(
    lctx: &ListenerCtx,
    info: &ConnInfo,
    connect: &Connect,
    password: Option<&bytes::Bytes>,
    left: Duration,
) -> Result<Identity, ReasonCode> {
    let req = ConnectRequest {
        client_id: &connect.client_id,
        username: connect.username.as_deref(),
        password,
        peer: info.peer,
        protocol: connect.protocol,
        tls_client_cn: info.tls_client_cn.as_deref(),
    };
    let verdict = match lctx.chain.authenticate(&req, lctx.policy) {
        starling_hooks::Verdict::Now(v) => v,
        starling_hooks::Verdict::Later(v) => match time::timeout(left, v).await {
            Some(v) => v,
            None => {
                add(&lctx.shared.metrics.verdict_timeouts, 1);
                Err(Refusal {
                    code: ReasonCode::ServerUnavailable,
                    why: "authentication timed out",
                })
            }
        },
    };
    verdict.map_err(|r| {
        if matches!(
            r.code,
            ReasonCode::BadUserNameOrPassword | ReasonCode::NotAuthorized
        ) {
            add(&lctx.shared.metrics.login_failed, 1);
        }
        log_login(lctx, info, connect.username.as_deref(), r.why);
        r.code
    })
}

/// The connect event (CONNECT received, `refused: None`) or a refusal's connack event, if
/// some provider wants it.
fn connect_event(
    lctx: &ListenerCtx,
    connect: &Connect,
    info: &ConnInfo,
    refused: Option<ReasonCode>,
) {
    let chain = &lctx.chain;
    let kind = match refused {
        None => EventKind::ClientConnect,
        Some(_) => EventKind::ClientConnack,
    };
    if !chain.wants(kind) {
        return;
    }
    let what = match refused {
        None => What::ClientConnect {
            peer: info.peer,
            protocol: connect.protocol,
        },
        Some(code) => What::ClientConnack {
            peer: info.peer,
            code,
        },
    };
    chain.emit(&Event {
        who: Subject {
            node: lctx.shared.node.clone(),
            client_id: Arc::from(connect.client_id.as_str()),
            username: connect.username.as_deref().map(Arc::from),
        },
        what,
    });
}

fn log_login(lctx: &ListenerCtx, info: &ConnInfo, username: Option<&str>, reason: &'static str) {
    if let Some(suppressed) = lctx.log_logins.admit() {
        info!(
            listener = %info.kind,
            peer = %info.peer,
            username = username.unwrap_or(""),
            reason,
            suppressed,
            "login refused"
        );
    }
}

/// Answers a CONNECT that did not decode, in the client's version when it can be told
/// (MQTT 5 §3.1.2.2: unknown versions get 0x84, in 3.x form 0x01). One declaring more
/// than `max_connect_packet_size` gets 0x95 Packet too large in MQTT 5; MQTT 3.x has no
/// such code, so the connection is just closed.
async fn refuse_malformed(
    io: &mut Box<dyn Io>,
    buf: &mut BytesMut,
    error: &CodecError,
    left: Duration,
    written: impl FnOnce(),
) {
    let code = error.reason_code();
    if code == ReasonCode::PacketTooLarge {
        // The size is known from the fixed header alone; the protocol level may be a few
        // bytes further on. Read at most up to the first buffer's size, briefly, to tell.
        let wait = left.min(Duration::from_secs(1));
        let _ = time::timeout(wait, async {
            while matches!(peek_protocol(buf), Ok(None)) && buf.len() < FIRST_READ {
                let mut limited = (&mut *io).take((FIRST_READ - buf.len()) as u64);
                match limited.read_buf(buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
    let protocol = match peek_protocol(buf) {
        Ok(Some(p)) => Some(p),
        _ if code == ReasonCode::UnsupportedProtocolVersion => Some(Protocol::V3_1_1),
        _ => None,
    };
    match protocol {
        Some(Protocol::V5) => refuse(io, Protocol::V5, code, written).await,
        Some(_) if code == ReasonCode::PacketTooLarge => {}
        Some(p) => refuse(io, p, code, written).await,
        None => {}
    }
}

/// Reads the CONNECT, returning it with the read-budget permit its bytes hold (if it was
/// larger than the first buffer). Refuses, before buffering, a CONNECT declaring more than
/// `max_connect`.
async fn read_connect(
    io: &mut Box<dyn Io>,
    buf: &mut BytesMut,
    lctx: &ListenerCtx,
) -> Result<(Connect, Option<OwnedSemaphorePermit>), ConnectError> {
    let mut budget = None;
    loop {
        match decode_connect(buf, lctx.max_connect) {
            Ok(Some(c)) => return Ok((c, budget)),
            Ok(None) => {}
            Err(e) => {
                if matches!(e, CodecError::PacketTooLarge { .. }) {
                    add(&lctx.shared.metrics.connect_too_large, 1);
                }
                return Err(e.into());
            }
        }
        // `decode_connect` has checked the declared size against `max_connect`.
        if let (None, Some(size)) = (&budget, declared_size(buf)) {
            if size > buf.capacity() {
                budget = Some(reserve_budget(lctx, size).await?);
                buf.reserve(size - buf.len());
            }
        }
        match io.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(ConnectError::Closed),
            Ok(_) => {}
        }
    }
}

/// Takes `size` bytes from the listener's CONNECT read budget, waiting (and counting the
/// wait) while it is spent; the caller's deadline bounds the wait.
async fn reserve_budget(
    lctx: &ListenerCtx,
    size: usize,
) -> Result<OwnedSemaphorePermit, ConnectError> {
    // `size` is at most `max_connect`, a u32, and the budget holds at least that much.
    let n = u32::try_from(size).map_err(|_| ConnectError::Closed)?;
    match lctx.connect_budget.clone().try_acquire_many_owned(n) {
        Ok(p) => Ok(p),
        Err(_) => {
            add(&lctx.shared.metrics.connect_budget_waits, 1);
            lctx.connect_budget
                .clone()
                .acquire_many_owned(n)
                .await
                .map_err(|_| ConnectError::Closed)
        }
    }
}

/// The whole size of the packet at the start of `buf` (fixed header included), once its
/// Remaining Length is all there (MQTT 5 §1.5.5: at most 4 bytes).
fn declared_size(buf: &[u8]) -> Option<usize> {
    let mut remaining = 0usize;
    for (i, &b) in buf.get(1..)?.iter().take(4).enumerate() {
        remaining |= usize::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return Some(1 + (i + 1) + remaining);
        }
    }
    None
}

/// A broker-assigned client id: unique with overwhelming probability, from the runtime's
/// rng (deterministic under simulation).
fn assign_client_id() -> String {
    let mut r = rng::rng();
    format!("starling-{:016x}{:08x}", r.next_u64(), r.next_u32())
}

#[cfg(test)]
mod tests {
    use super::declared_size;

    #[test]
    fn declared_size_counts_the_fixed_header_once_the_length_is_complete() {
        assert_eq!(declared_size(&[0x10]), None);
        assert_eq!(declared_size(&[0x10, 0x0A]), Some(12));
        assert_eq!(declared_size(&[0x10, 0x80]), None);
        assert_eq!(declared_size(&[0x10, 0x80, 0x01]), Some(131));
        // 1 MiB: 0x80 0x80 0x40.
        assert_eq!(
            declared_size(&[0x10, 0x80, 0x80, 0x40]),
            Some(4 + (1 << 20))
        );
    }
}
