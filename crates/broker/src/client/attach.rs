//! A connection attaching to the client's session: first, resumed, or taking over.

use bytes::BytesMut;
use starling_codec::ReasonCode;
use starling_hooks::DisconnectReason;
use starling_rt::{time, Ctx};
use starling_session::DetachReason;
use tracing::{debug, Instrument};

use super::Client;
use crate::conn::{linger, Conn};
use crate::gate::AuthGate;

use crate::msg::NewConn;

impl Client {
    pub(super) async fn attach(&mut self, nc: Box<NewConn>, ctx: &mut Ctx<Self>) {
        self.attaches = self.attaches.wrapping_add(1);
        self.retiring = false;
        if self.session.is_attached() {
            // Takeover (MQTT 5 §3.1.4): the old connection is closed (0x8E), the session
            // moves to the new one.
            debug!(peer = %nc.peer, "session taken over");
            self.closing = Some(DisconnectReason::Server(ReasonCode::SessionTakenOver));
            self.session.detach(time::now(), DetachReason::TakenOver);
            self.run_effects(ctx).await;
        }
        // A connection the session no longer knows (it was closed above, or broke while a
        // write failed) must not linger.
        self.close_conn(None, ctx).await;
        let NewConn {
            connect,
            io,
            buf,
            peer,
            username,
            permit,
            accepted,
            listener,
        } = *nc;
        let chain = self.gate.chain().clone();
        self.gate = AuthGate::new(
            self.shared.clone(),
            chain,
            username,
            self.client_id(),
            peer.ip(),
        );
        // A wait of the old connection is over: its packets went with it.
        self.waiting = false;
        self.closing = None;
        let protocol = connect.protocol;
        self.conn = Some(Conn {
            io,
            input: buf,
            input_ended: false,
            end_owed: false,
            held: None,
            releasing: false,
            eof: false,
            out: BytesMut::new(),
            protocol,
            connected_at: u32::try_from(time::unix_secs()).unwrap_or(u32::MAX),
            peer_port: peer.port(),
            clean_start: connect.clean_start,
            _permit: permit,
            timed: None,
            moved_to: None,
            urgent: false,
            deferred: 0,
        });
        match self.session.attach(time::now(), &connect) {
            Ok(a) => {
                let m = &self.shared.metrics;
                crate::metrics::add_with_max(&m.clients_connected, &m.clients_connected_max);
                // Stored before the CONNACK goes: a session the client is told it has.
                self.meta_changed(true);
                self.presence(true).await;
                self.attached_events(&connect, peer, a);
            }
            Err(e) => {
                // The session refused the connection before anything was sent (a CONNACK
                // past the client's Maximum Packet Size, MQTT 5 §3.1.2.11.4): close it at
                // once. It never counted as connected, so no presence or event goes out.
                debug!(error = %e, "attach refused; closing");
                if let Some(c) = self.conn.take() {
                    starling_rt::spawn(linger(c.io).instrument(tracing::Span::current()));
                }
                return;
            }
        }
        self.run_effects(ctx).await;
        // The CONNACK is first in the output: the handshake ends when what is there now is
        // written (after the session's store write, when it waits for one).
        if let Some(c) = &mut self.conn {
            c.time_connack(accepted, listener);
        }
    }
}
