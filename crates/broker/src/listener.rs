//! The listener actor (accept loop) and the CONNECT handshake each accepted connection runs
//! in its own task before it is handed to the registry.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rand::RngCore;
use starling_auth::{AuthResult, Authenticator};
use starling_codec::{
    decode_connect, encode, peek_protocol, Connect, Packet, Protocol, ReasonCode,
};
use starling_net::{ConnInfo, MqttListener, NetError, PendingConnection};
use starling_rt::{rng, time, Actor, Addr, Ctx};
use starling_session::{check_connect, refusal, ClientIdentity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn, Instrument};

use crate::client::{Io, NewConn};
use crate::metrics::add;
use crate::registry::RegistryMsg;
use crate::settings::Shared;

/// What every connection of one listener needs.
pub(crate) struct ListenerCtx {
    pub shared: Arc<Shared>,
    pub registry: Addr<RegistryMsg>,
    pub auth: Authenticator,
    /// Seconds from accept to a complete CONNECT.
    pub connect_timeout: Duration,
    /// max_connections: one permit per open connection.
    pub connections: Arc<Semaphore>,
    /// Whether the TLS client certificate's CN is the username.
    pub cn_as_username: bool,
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
                let span = tracing::debug_span!("conn", %peer);
                starling_rt::spawn(
                    async move {
                        // Boxed apart: a TLS or WebSocket handshake's state is kilobytes, and
                        // while it is not running the task should hold only what follows.
                        // Its place under max_handshakes is freed when this returns, before
                        // the CONNECT is read: a client slow to send it must not hold up
                        // other connections (the handshake timeout bounds it).
                        match Box::pin(pending.handshake()).await {
                            Ok((stream, info)) => {
                                Box::pin(serve(Box::new(stream), info, Some(permit), lctx)).await
                            }
                            Err(e) => debug!(error = %e, "transport handshake failed"),
                        }
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
    Codec(#[from] starling_codec::Error),
}

/// Runs the CONNECT handshake on an accepted stream and hands the connection to the
/// registry: reads the CONNECT (under the listener's timeout), authenticates, checks it
/// against the session limits, assigns a client id if needed. Refusals get their CONNACK.
pub(crate) async fn serve(
    mut io: Box<dyn Io>,
    info: ConnInfo,
    permit: Option<OwnedSemaphorePermit>,
    lctx: Arc<ListenerCtx>,
) {
    let shared = &lctx.shared;
    let max = shared.limits.packet_size_max;
    // Small: a CONNECT is typically well under 256 bytes; the buffer grows if needed.
    let mut buf = BytesMut::with_capacity(256);
    let read = time::timeout(lctx.connect_timeout, read_connect(&mut io, &mut buf, max)).await;
    let result = match read {
        None => Err(ConnectError::Timeout(lctx.connect_timeout)),
        Some(r) => r,
    };
    let mut connect = match result {
        Ok(c) => c,
        Err(e) => {
            add(&shared.metrics.connections_refused, 1);
            if let ConnectError::Codec(_) = &e {
                // Garbage where a CONNECT belongs (any transport): worth an operator's eye,
                // and bounded by the listener's handshake limits.
                info!(
                    listener = %info.kind,
                    peer = %info.peer,
                    error = %e,
                    "connection refused: malformed CONNECT"
                );
            } else {
                debug!(error = %e, "connection closed before session");
            }
            if let ConnectError::Codec(ce) = &e {
                // Answer in the client's version when it can be told (MQTT 5 §3.1.2.2:
                // unknown versions get 0x84, in 3.x form 0x01).
                let code = ce.reason_code();
                let protocol = match peek_protocol(&buf) {
                    Ok(Some(p)) => Some(p),
                    _ if code == ReasonCode::UnsupportedProtocolVersion => Some(Protocol::V3_1_1),
                    _ => None,
                };
                if let Some(p) = protocol {
                    refuse(&mut io, p, code).await;
                }
            }
            return;
        }
    };
    let username = if lctx.cn_as_username {
        info.tls_client_cn.clone().or(connect.username.clone())
    } else {
        connect.username.clone()
    };
    let auth = lctx
        .auth
        .authenticate(connect.username.as_deref(), connect.password.as_deref());
    if auth != AuthResult::Allowed && !(lctx.cn_as_username && info.tls_client_cn.is_some()) {
        add(&shared.metrics.connections_refused, 1);
        let code = match auth {
            AuthResult::BadCredentials => ReasonCode::BadUserNameOrPassword,
            _ => ReasonCode::NotAuthorized,
        };
        debug!(?code, "CONNECT refused by authentication");
        refuse(&mut io, connect.protocol, code).await;
        return;
    }
    let client_id: Arc<str> = match check_connect(&connect, &shared.limits) {
        Ok(ClientIdentity::Given) => Arc::from(connect.client_id.as_str()),
        Ok(ClientIdentity::MustAssign) => Arc::from(assign_client_id()),
        Err(code) => {
            add(&shared.metrics.connections_refused, 1);
            debug!(?code, "CONNECT refused");
            refuse(&mut io, connect.protocol, code).await;
            return;
        }
    };
    // An assigned id leaves `connect.client_id` empty: the session announces it in CONNACK.
    connect.password = None;
    let conn = Box::new(NewConn {
        connect,
        io,
        buf,
        peer: info.peer,
        username,
        permit,
    });
    let _ = lctx
        .registry
        .send(RegistryMsg::Connect { client_id, conn })
        .await;
}

async fn read_connect(
    io: &mut Box<dyn Io>,
    buf: &mut BytesMut,
    max: u32,
) -> Result<Connect, ConnectError> {
    loop {
        if let Some(c) = decode_connect(buf, max)? {
            return Ok(c);
        }
        if buf.capacity() - buf.len() < 128 {
            buf.reserve(buf.len().max(256));
        }
        match io.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(ConnectError::Closed),
            Ok(_) => {}
        }
    }
}

async fn refuse(io: &mut Box<dyn Io>, protocol: Protocol, code: ReasonCode) {
    let mut out = BytesMut::new();
    if encode(
        &Packet::Connack(refusal(code)),
        protocol,
        u32::MAX,
        &mut out,
    )
    .is_ok()
    {
        let _ = time::timeout(Duration::from_secs(5), async {
            io.write_all(&out).await?;
            io.flush().await?;
            io.shutdown().await?;
            // Read until the peer closes: closing with unread input sends RST, which can
            // destroy the CONNACK before the client reads it.
            let mut scratch = [0u8; 256];
            while io.read(&mut scratch).await? > 0 {}
            std::io::Result::Ok(())
        })
        .await;
    }
}

/// A broker-assigned client id: unique with overwhelming probability, from the runtime's
/// rng (deterministic under simulation).
fn assign_client_id() -> String {
    let mut r = rng::rng();
    format!("starling-{:016x}{:08x}", r.next_u64(), r.next_u32())
}
