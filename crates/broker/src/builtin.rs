//! The built-in providers behind the hook chain (`starling-hooks`): the password file
//! (authentication) and the ACL file (authorization). The `$SYS` client events are the
//! built-in event provider, in `sys`.
//!
//! Both behave as they did before the chain: the same reason codes, the same bans, the
//! same counters; a password is verified on the pool of threads of its own
//! (`auth.verify_threads`), never on the threads that serve connections.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use starling_auth::{
    Acl, Action as AclAction, Admission, ClientInfo, Decision, FailureLimits, LoginGuard,
    PasswordFile, Recorded, Scope,
};
use starling_codec::ReasonCode;
use starling_hooks::{
    About, Action, Answer, AuthnAnswer, AuthnProvider, AuthzProvider, AuthzRequest, ClientRef,
    ConnectRequest, Hooks, Identity, Refusal, Verdict,
};
use starling_rt::blocking::BlockingPool;
use starling_rt::throttle::Throttle;
use starling_rt::{time, Actor, Addr, Ctx, Reply};
use tracing::info;

use crate::listener::LOG_EVERY;
use crate::metrics::add;
use crate::settings::Shared;

/// Sources the login guard tracks at most (about 100 bytes each).
const GUARD_SOURCES_MAX: usize = 65_536;

/// The built-in providers the configuration asks for, in chain order: the password file,
/// then the ACL. Either is left out when its file is not configured (an empty ACL decides
/// nothing; without a password file no username is verified).
pub(crate) fn builtin(shared: &Arc<Shared>) -> Hooks {
    let mut hooks = Hooks::new();
    if let Some(file) = &shared.passwords {
        hooks = hooks.authenticate_with(PasswordProvider {
            shared: shared.clone(),
            file: Arc::new(file.clone()),
            logins: Logins::start(shared),
        });
    }
    if !shared.acl.is_empty() {
        hooks = hooks.authorize_with(AclProvider {
            shared: shared.clone(),
        });
    }
    hooks
}

/// The password file: decides every CONNECT with a username or a password (a user it does
/// not know is refused, 0x86, as a wrong password is), ignores those with neither.
struct PasswordProvider {
    shared: Arc<Shared>,
    /// Shared with the verification jobs, which run on the pool's threads.
    file: Arc<PasswordFile>,
    logins: Logins,
}

const BAD_CREDENTIALS: Refusal = Refusal {
    code: ReasonCode::BadUserNameOrPassword,
    why: "bad user name or password",
};

impl AuthnProvider for PasswordProvider {
    fn authenticate(&self, req: &ConnectRequest<'_>) -> Verdict<AuthnAnswer> {
        let (user, password) = match (req.username, req.password) {
            (None, None) => return Verdict::Now(AuthnAnswer::Ignore),
            // Nothing to verify: refused at once, and not counted towards a ban (only
            // verified failures are: they are what costs the broker).
            (None, Some(_)) | (Some(_), None) => {
                return Verdict::Now(AuthnAnswer::Deny(BAD_CREDENTIALS))
            }
            (Some(u), Some(p)) => (u.to_owned(), p.clone()),
        };
        let ip = req.peer.ip();
        let (shared, file, logins) = (self.shared.clone(), self.file.clone(), self.logins.clone());
        Verdict::later(async move {
            let metrics = &shared.metrics;
            let unavailable = |why| {
                AuthnAnswer::Deny(Refusal {
                    // MQTT 5 §3.2.2.2 0x88 (3.x return code 3): retry later, and nothing said
                    // about the password.
                    code: ReasonCode::ServerUnavailable,
                    why,
                })
            };
            let admission = logins
                .guard
                .ask(|r| GuardMsg::Check(ip, r))
                .await
                .unwrap_or(Admission::Verify);
            if let Admission::Banned { .. } = admission {
                add(&metrics.login_banned, 1);
                return unavailable("address banned after failed logins");
            }
            let verify = {
                let user = user.clone();
                move || file.verify(&user, &password)
            };
            // An address that failed recently waits in the pool's second lane, behind every
            // other: a storm from many addresses fills that lane (and is refused there)
            // while clients outside it still get the next free verification.
            let job = match admission {
                Admission::VerifyLater => logins.pool.try_run_later(verify),
                _ => logins.pool.try_run(verify),
            };
            let Ok(job) = job else {
                add(&metrics.verify_queue_full, 1);
                return unavailable("password verification queue full");
            };
            match job.await {
                Ok(true) => AuthnAnswer::Allow(Identity::new(Some(user))),
                Ok(false) => {
                    // `try_send`: under a storm a full guard mailbox loses a count, not a
                    // thread.
                    let _ = logins.guard.try_send(GuardMsg::Failed(ip));
                    AuthnAnswer::Deny(BAD_CREDENTIALS)
                }
                Err(_) => unavailable("password verification lost"),
            }
        })
    }

    fn about(&self) -> About {
        let a = &self.shared.config.auth;
        let file = a.password_file.as_ref().map(|f| f.display().to_string());
        About::named("starling-password-file")
            .version(env!("CARGO_PKG_VERSION"))
            .descr("Authenticates CONNECTs by the users and password hashes of auth.password_file")
            .setting("password_file", file.unwrap_or_default())
            .setting("users", self.file.len())
            .setting("verify_threads", self.logins.pool.threads())
            .setting("failed_logins_max", a.failed_logins_max)
            .setting("failed_login_ban_secs", a.failed_login_ban_secs)
    }
}

/// The ACL file: the first rule that matches decides; what no rule speaks of is ignored
/// (left to the next provider, then `auth.acl_default`). Always ready.
struct AclProvider {
    shared: Arc<Shared>,
}

fn info<'a>(c: &ClientRef<'a>) -> ClientInfo<'a> {
    ClientInfo {
        username: c.username,
        client_id: c.client_id,
        addr: c.addr,
    }
}

fn answer(d: Option<Decision>) -> Answer {
    match d {
        Some(Decision::Allow) => Answer::Allow,
        Some(Decision::Deny) => Answer::Deny,
        None => Answer::Ignore,
    }
}

impl AuthzProvider for AclProvider {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict<Answer> {
        let acl: &Acl = &self.shared.acl;
        let who = info(&req.client);
        Verdict::Now(match req.action {
            Action::Publish { .. } => {
                answer(acl.rule_decision(&who, AclAction::Publish, req.topic))
            }
            Action::Read => answer(acl.read_rule_decision(&who, req.topic)),
            // Granted when the rules let it read at least part of what the filter matches;
            // what they deny is withheld at delivery (a read check).
            Action::Subscribe { .. } => match acl.subscribe_rule_scope(&who, req.topic) {
                None => Answer::Ignore,
                Some(Scope::Nothing) => Answer::Deny,
                Some(Scope::All | Scope::Partial) => Answer::Allow,
            },
        })
    }

    fn may_deny_reads(&self, client: &ClientRef<'_>) -> bool {
        self.shared.acl.may_deny_reads(&info(client))
    }

    fn answers_later(&self) -> bool {
        false
    }

    fn about(&self) -> About {
        let a = &self.shared.config.auth;
        let file = a.acl_file.as_ref().map(|f| f.display().to_string());
        About::named("starling-acl")
            .version(env!("CARGO_PKG_VERSION"))
            .descr("Authorizes publishes, subscribes and deliveries by the rules of auth.acl_file")
            .setting("acl_file", file.unwrap_or_default())
            .setting("rules", self.shared.acl.len())
            .setting("acl_default", format!("{:?}", a.acl_default).to_lowercase())
    }
}

/// Password verification shared by every listener: the pool that runs it off the
/// connection threads, and the guard actor that bans addresses that keep failing.
#[derive(Clone)]
struct Logins {
    pool: BlockingPool,
    guard: Addr<GuardMsg>,
}

impl Logins {
    /// Starts the guard and the verification pool as `[auth]` says.
    fn start(shared: &Shared) -> Self {
        let a = &shared.config.auth;
        let threads = a
            .verify_threads
            .map_or_else(BlockingPool::default_threads, |t| t as usize);
        let pool = BlockingPool::new("starling-verify", threads, a.verify_queue as usize);
        let limits = FailureLimits {
            failures_max: a.failed_logins_max.max(1),
            window: Duration::from_secs(u64::from(a.failed_logins_window_secs.max(1))),
            ban: Duration::from_secs(u64::from(a.failed_login_ban_secs.max(1))),
            sources_max: GUARD_SOURCES_MAX,
        };
        let guard = starling_rt::start_with(
            GuardActor {
                guard: LoginGuard::new(limits),
                started_at: time::now(),
                log_bans: Throttle::new(LOG_EVERY),
                prune_every: limits.window,
            },
            starling_rt::Options::named("login-guard").capacity(1024),
        );
        Logins { pool, guard }
    }
}

enum GuardMsg {
    /// May credentials from this address be verified now?
    Check(IpAddr, Reply<Admission>),
    /// A verification from this address failed.
    Failed(IpAddr),
    Prune,
}

/// Owns the failed-login counts and bans (a sans-IO [`LoginGuard`]), so that every
/// connection task of every listener sees the same bans.
struct GuardActor {
    guard: LoginGuard,
    started_at: time::Instant,
    log_bans: Throttle,
    prune_every: Duration,
}

impl GuardActor {
    fn now(&self) -> Duration {
        time::now().saturating_duration_since(self.started_at)
    }
}

impl Actor for GuardActor {
    type Msg = GuardMsg;

    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        ctx.every(self.prune_every, || GuardMsg::Prune);
    }

    async fn handle(&mut self, msg: GuardMsg, _ctx: &mut Ctx<Self>) {
        match msg {
            GuardMsg::Check(ip, reply) => {
                let _ = reply.send(self.guard.check(self.now(), ip));
            }
            GuardMsg::Failed(ip) => {
                let now = self.now();
                if let Recorded::BanStarted { until } = self.guard.record_failure(now, ip) {
                    if let Some(suppressed) = self.log_bans.admit() {
                        info!(
                            %ip,
                            ban_secs = until.saturating_sub(now).as_secs(),
                            suppressed,
                            "address banned after repeated failed logins"
                        );
                    }
                }
            }
            GuardMsg::Prune => self.guard.prune(self.now()),
        }
    }
}
