//! How a provider presents itself to an operator: the broker lists its chain's providers
//! as RMQTT lists its plugins (`GET /api/v1/plugins`).

/// A provider's name, what it does, and the settings it runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct About {
    /// Its name, unique within a chain by convention (the built-in ones are `starling-*`);
    /// by default the provider's type name.
    pub name: String,
    /// One sentence on what it decides or observes.
    pub descr: String,
    /// Its version, if it has one of its own.
    pub version: Option<String>,
    /// Its settings as an operator reads them (name, value), secrets left out.
    pub settings: Vec<(String, String)>,
}

impl About {
    /// A provider called `name` that says nothing more of itself.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            descr: String::new(),
            version: None,
            settings: Vec::new(),
        }
    }

    /// With `descr` as its description.
    pub fn descr(mut self, descr: impl Into<String>) -> Self {
        self.descr = descr.into();
        self
    }

    /// With `version` as its version.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// With the setting `name` = `value` appended.
    pub fn setting(mut self, name: impl Into<String>, value: impl ToString) -> Self {
        self.settings.push((name.into(), value.to_string()));
        self
    }
}

/// Which of the chain's hooks a provider is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HookKind {
    /// CONNECT authentication ([`crate::AuthnProvider`]).
    Authenticate,
    /// PUBLISH, SUBSCRIBE and delivery authorization ([`crate::AuthzProvider`]).
    Authorize,
    /// Lifecycle events ([`crate::EventProvider`]).
    Observe,
}

impl HookKind {
    /// Its name in the API: `authenticate`, `authorize`, `observe`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::Authenticate => "authenticate",
            HookKind::Authorize => "authorize",
            HookKind::Observe => "observe",
        }
    }
}

/// The default [`About`] of a provider type: its type name, without the module path.
pub(crate) fn type_about<T: ?Sized>() -> About {
    let full = std::any::type_name::<T>();
    // `a::b::C<d::E>` → `C<d::E>`: the last path segment before any generics.
    let head = full.split('<').next().unwrap_or(full);
    let start = head.rfind("::").map_or(0, |i| i + 2);
    About::named(&full[start..])
}
