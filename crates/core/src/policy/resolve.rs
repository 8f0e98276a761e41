//! Rule resolution: which [`Rule`] decides for a resource (the five steps
//! and the tie-break are described in the [`policy`](super) module docs).

use std::borrow::{Borrow, Cow};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};

use super::{PolicyBody, PolicyError, PolicyKind, validate};
use crate::ids::Signal;

/// A resource's attributes, read as text by key.
pub trait Attributes {
    fn attr(&self, key: &str) -> Option<Cow<'_, str>>;
}

impl<K: AsRef<str>, V: AsRef<str>> Attributes for [(K, V)] {
    fn attr(&self, key: &str) -> Option<Cow<'_, str>> {
        let (_, v) = self.iter().find(|(k, _)| k.as_ref() == key)?;
        Some(Cow::Borrowed(v.as_ref()))
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> Attributes for [(K, V); N] {
    fn attr(&self, key: &str) -> Option<Cow<'_, str>> {
        self.as_slice().attr(key)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Attributes for Vec<(K, V)> {
    fn attr(&self, key: &str) -> Option<Cow<'_, str>> {
        self.as_slice().attr(key)
    }
}

impl<K: Borrow<str> + Hash + Eq, V: AsRef<str>, S: BuildHasher> Attributes for HashMap<K, V, S> {
    fn attr(&self, key: &str) -> Option<Cow<'_, str>> {
        self.get(key).map(|v| Cow::Borrowed(v.as_ref()))
    }
}

impl<K: Borrow<str> + Ord, V: AsRef<str>> Attributes for BTreeMap<K, V> {
    fn attr(&self, key: &str) -> Option<Cow<'_, str>> {
        self.get(key).map(|v| Cow::Borrowed(v.as_ref()))
    }
}

/// A stored policy: the catalog's (kind, name, tenant) and its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub kind: PolicyKind,
    pub name: String,
    /// `""`: every tenant (or those matching `body.tenant_glob`).
    pub tenant: String,
    pub body: PolicyBody,
}

impl Rule {
    /// Validates `body_json` (see [`validate`]) into a rule.
    pub fn parse(
        kind: PolicyKind,
        name: &str,
        tenant: &str,
        body_json: &str,
        targets: Option<&[String]>,
    ) -> Result<Rule, PolicyError> {
        Ok(Rule {
            kind,
            name: name.to_owned(),
            tenant: tenant.to_owned(),
            body: validate(kind, name, tenant, body_json, targets)?,
        })
    }

    /// Whether the rule can apply to data of `tenant` and `signal`,
    /// whatever the resource.
    pub fn applies_to(&self, tenant: &str, signal: Signal) -> bool {
        (self.tenant.is_empty() || self.tenant == tenant)
            && self.body.tenant_glob.as_deref().is_none_or(|g| glob_match(g, tenant))
            && self.body.applies_to_signal(signal)
    }
}

/// Whole-string match of `*` (any run) and `?` (one byte; tenants are
/// ASCII).
pub(super) fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    // After a `*`: where it is in the pattern, and the text it stops at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    star = Some((sp, st + 1));
                    pi = sp + 1;
                    ti = st + 1;
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Which of two rules wins a resolution step: higher priority, then more
/// matchers, then the smaller name.
pub(super) fn precedence(a: &Rule, b: &Rule) -> Ordering {
    (b.body.priority.cmp(&a.body.priority))
        .then_with(|| b.body.selector.len().cmp(&a.body.selector.len()))
        .then_with(|| a.name.cmp(&b.name))
}

/// The rules of one kind, split by resolution step, each list best first.
#[derive(Clone, Debug, Default)]
struct Steps {
    tenant_selector: HashMap<String, Vec<Rule>>,
    global_selector: Vec<Rule>,
    tenant_default: HashMap<String, Vec<Rule>>,
    global_default: Vec<Rule>,
}

/// Rules indexed for resolution. Answers do not depend on the order the
/// rules were given in.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    retention: Steps,
    offload: Steps,
}

impl RuleSet {
    pub fn new(rules: Vec<Rule>) -> RuleSet {
        // The canonical body is the last tie-break, so even two rules
        // with one name (which the catalog's (kind, name) key prevents)
        // order the same whatever order they came in.
        let mut keyed: Vec<(String, Rule)> = rules.into_iter().map(|r| (r.body.to_json(), r)).collect();
        keyed.sort_by(|(ja, a), (jb, b)| {
            precedence(a, b)
                .then_with(|| a.tenant.cmp(&b.tenant))
                .then_with(|| ja.cmp(jb))
        });
        let mut set = RuleSet::default();
        for (_, rule) in keyed {
            let steps = match rule.kind {
                PolicyKind::Retention => &mut set.retention,
                PolicyKind::Offload => &mut set.offload,
            };
            let list = match (rule.tenant.is_empty(), rule.body.selector.is_empty()) {
                (false, false) => steps.tenant_selector.entry(rule.tenant.clone()).or_default(),
                (true, false) => &mut steps.global_selector,
                (false, true) => steps.tenant_default.entry(rule.tenant.clone()).or_default(),
                (true, true) => &mut steps.global_default,
            };
            list.push(rule);
        }
        set
    }

    /// Every rule of `kind`, each resolution step's best first.
    pub fn rules(&self, kind: PolicyKind) -> impl Iterator<Item = &Rule> {
        let s = self.steps(kind);
        (s.tenant_selector.values().flatten())
            .chain(&s.global_selector)
            .chain(s.tenant_default.values().flatten())
            .chain(&s.global_default)
    }

    /// Holds no rule of either kind.
    pub fn is_empty(&self) -> bool {
        self.rules(PolicyKind::Retention).next().is_none() && self.rules(PolicyKind::Offload).next().is_none()
    }

    fn steps(&self, kind: PolicyKind) -> &Steps {
        match kind {
            PolicyKind::Retention => &self.retention,
            PolicyKind::Offload => &self.offload,
        }
    }

    /// The rule that decides for a resource of `tenant` and `signal` with
    /// these attributes, or `None`: keep forever (no offload).
    pub fn resolve<A: Attributes + ?Sized>(
        &self,
        kind: PolicyKind,
        tenant: &str,
        signal: Signal,
        resource: &A,
    ) -> Option<&Rule> {
        let s = self.steps(kind);
        let tenant_rules = s.tenant_selector.get(tenant).map_or(&[][..], Vec::as_slice);
        let matching = |r: &&Rule| r.applies_to(tenant, signal) && r.body.matches(resource);
        (tenant_rules.iter().find(matching))
            .or_else(|| s.global_selector.iter().find(matching))
            .or_else(|| self.resolve_default(kind, tenant, signal))
    }

    /// Whether any rule with a selector can apply to `tenant` and `signal`.
    /// When false, [`RuleSet::resolve_default`] is the answer for every
    /// resource and no block's resources need reading.
    pub fn needs_resources(&self, kind: PolicyKind, tenant: &str, signal: Signal) -> bool {
        let s = self.steps(kind);
        let applies = |r: &Rule| r.applies_to(tenant, signal);
        s.tenant_selector.get(tenant).is_some_and(|rs| rs.iter().any(applies)) || s.global_selector.iter().any(applies)
    }

    /// The rule for a resource that no selector rule matches (steps 3-5).
    pub fn resolve_default(&self, kind: PolicyKind, tenant: &str, signal: Signal) -> Option<&Rule> {
        let s = self.steps(kind);
        let tenant_rules = s.tenant_default.get(tenant).map_or(&[][..], Vec::as_slice);
        let applies = |r: &&Rule| r.applies_to(tenant, signal);
        tenant_rules
            .iter()
            .find(applies)
            .or_else(|| s.global_default.iter().find(applies))
    }
}
