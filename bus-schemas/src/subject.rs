//! Subject builders and parsers (docs/design.md §2, contract).
//!
//! Every event travels on `aware.v1.<event>.<slot>.<namespace>.<target>`. The slot is the
//! sharding key ([`slot`]: FNV-1a of `namespace/name` modulo [`SLOTS`], in decimal): an instance
//! of a per-target service subscribes only to the slots of its shard, so the server, not the
//! instance, drops the other shards' messages (ADR 0021). Kubernetes object names may contain
//! `.` (DNS-1123 subdomains) which is the NATS token separator, so a `.` in a namespace or name
//! is written as `_` in the subject. `_` never occurs in a Kubernetes name, so the mapping is
//! reversible.

use crate::{EventKind, Target};

/// Prefix of every AWARE subject, including the contract version.
pub const PREFIX: &str = "aware.v1";
/// Filter matching every AWARE event (used by the JetStream stream and `aware watch`).
pub const ALL: &str = "aware.v1.>";
/// The slots subjects carry: shards own slots, so at most this many shards.
pub const SLOTS: u32 = 256;

/// FNV-1a (64-bit) of `s`: stable across builds and platforms, unlike `std`'s hasher.
pub fn stable_hash(s: &str) -> u64 {
    fnv1a(FNV_OFFSET, s.as_bytes())
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of `bytes` continued from `h`: hashing parts in turn hashes their concatenation.
fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// [`stable_hash`] with every bit mixed (MurmurHash3's 64-bit finalizer): FNV-1a's high bits
/// barely depend on a string's last characters (`app-00001`, `app-00002`…), and its low bits
/// pick the slot. For spreading targets over anything but slots.
pub fn mixed_hash(s: &str) -> u64 {
    let mut h = stable_hash(s);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The slot of `target`'s subjects: FNV-1a of `namespace/name` modulo [`SLOTS`].
pub fn slot(target: &Target) -> u32 {
    // `stable_hash(&target.key())` without building the key: every message and every pass over
    // a shard's targets asks for it.
    let h = fnv1a(FNV_OFFSET, target.namespace.as_bytes());
    let h = fnv1a(fnv1a(h, b"/"), target.name.as_bytes());
    // The remainder is below SLOTS, so it fits.
    (h % u64::from(SLOTS)) as u32
}

/// Errors from building or parsing subjects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    #[error(
        "subject `{0}` is not an AWARE v1 subject (expected aware.v1.<event>.<slot>.<namespace>.<target>)"
    )]
    NotAware(String),
    #[error("subject `{subject}` carries slot `{token}`, but its target's slot is {expected}")]
    WrongSlot {
        subject: String,
        token: String,
        expected: u32,
    },
    #[error("subject `{subject}` has unknown event `{event}`")]
    UnknownEvent { subject: String, event: String },
    #[error("invalid {field} `{value}`: {reason}")]
    InvalidName {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
}

/// Checks that a namespace or name can be carried in a subject token.
pub fn validate_name(field: &'static str, value: &str) -> Result<(), SubjectError> {
    let bad = |reason| {
        Err(SubjectError::InvalidName {
            field,
            value: value.to_string(),
            reason,
        })
    };
    if value.is_empty() {
        return bad("must not be empty");
    }
    if value.len() > 253 {
        return bad("longer than 253 characters");
    }
    if value.contains('_') {
        return bad("`_` is reserved (Kubernetes names never contain it)");
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return bad("only ASCII letters, digits, `-` and `.` are allowed");
    }
    Ok(())
}

fn encode_token(value: &str) -> String {
    value.replace('.', "_")
}

fn decode_token(token: &str) -> String {
    token.replace('_', ".")
}

/// The subject of `kind` for `target`. Fails when the target's names cannot form a subject.
pub fn subject(kind: EventKind, target: &Target) -> Result<String, SubjectError> {
    validate_name("namespace", &target.namespace)?;
    validate_name("name", &target.name)?;
    Ok(format!(
        "{PREFIX}.{}.{}.{}.{}",
        kind.as_str(),
        slot(target),
        encode_token(&target.namespace),
        encode_token(&target.name)
    ))
}

/// A subscription filter: `None` parts become the `*` wildcard; the slot is a wildcard unless
/// both names are given.
pub fn filter(
    kind: Option<EventKind>,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<String, SubjectError> {
    if let Some(ns) = namespace {
        validate_name("namespace", ns)?;
    }
    if let Some(n) = name {
        validate_name("name", n)?;
    }
    let slot = match (namespace, name) {
        (Some(ns), Some(n)) => slot(&Target::new(ns, n)).to_string(),
        _ => "*".to_string(),
    };
    Ok(format!(
        "{PREFIX}.{}.{slot}.{}.{}",
        kind.map_or("*", EventKind::as_str),
        namespace.map_or_else(|| "*".to_string(), encode_token),
        name.map_or_else(|| "*".to_string(), encode_token),
    ))
}

/// The filter for every event of one kind, for every target.
pub fn kind_filter(kind: EventKind) -> String {
    format!("{PREFIX}.{}.*.*.*", kind.as_str())
}

/// The filter for every event of one kind, for the targets of one slot (`slot` < [`SLOTS`]).
pub fn slot_filter(kind: EventKind, slot: u32) -> String {
    format!("{PREFIX}.{}.{slot}.*.*", kind.as_str())
}

/// A parsed AWARE subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSubject {
    pub kind: EventKind,
    pub target: Target,
}

/// Parses `aware.v1.<event>.<slot>.<namespace>.<target>`. The slot must be the target's, in
/// canonical decimal: one target has one subject per kind, whatever a publisher claims.
pub fn parse(subject: &str) -> Result<ParsedSubject, SubjectError> {
    let Some(["aware", "v1", event, slot_token, ns, name]) = tokens(subject) else {
        return Err(SubjectError::NotAware(subject.to_string()));
    };
    let parsed = parsed(subject, event, ns, name)?;
    let expected = slot(&parsed.target);
    if slot_token != expected.to_string() {
        return Err(SubjectError::WrongSlot {
            subject: subject.to_string(),
            token: slot_token.to_string(),
            expected,
        });
    }
    Ok(parsed)
}

/// Parses the layout before the slot token, `aware.v1.<event>.<namespace>.<target>`: the keys
/// an older release left in the state bucket, read once so an upgrade keeps every target's state.
pub fn parse_unslotted(subject: &str) -> Result<ParsedSubject, SubjectError> {
    let Some(["aware", "v1", event, ns, name]) = tokens(subject) else {
        return Err(SubjectError::NotAware(subject.to_string()));
    };
    parsed(subject, event, ns, name)
}

/// The `N` tokens of `subject`, or `None` when it has another number.
fn tokens<const N: usize>(subject: &str) -> Option<[&str; N]> {
    let mut out = [""; N];
    let mut parts = subject.split('.');
    for t in &mut out {
        *t = parts.next()?;
    }
    parts.next().is_none().then_some(out)
}

/// `target`'s subject of `kind` in [`parse_unslotted`]'s layout (to purge an old state key).
pub fn unslotted_subject(kind: EventKind, target: &Target) -> Result<String, SubjectError> {
    validate_name("namespace", &target.namespace)?;
    validate_name("name", &target.name)?;
    Ok(format!(
        "{PREFIX}.{}.{}.{}",
        kind.as_str(),
        encode_token(&target.namespace),
        encode_token(&target.name)
    ))
}

/// The filter of [`parse_unslotted`]'s layout for every event of one kind.
pub fn unslotted_kind_filter(kind: EventKind) -> String {
    format!("{PREFIX}.{}.*.*", kind.as_str())
}

fn parsed(subject: &str, event: &str, ns: &str, name: &str) -> Result<ParsedSubject, SubjectError> {
    let kind = EventKind::from_token(event).ok_or_else(|| SubjectError::UnknownEvent {
        subject: subject.to_string(),
        event: event.to_string(),
    })?;
    let target = Target::new(decode_token(ns), decode_token(name));
    validate_name("namespace", &target.namespace)?;
    validate_name("name", &target.name)?;
    Ok(ParsedSubject { kind, target })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_parses_round_trip() {
        let t = Target::new("prod", "api.v2");
        let s = subject(EventKind::Obs, &t).unwrap();
        // FNV-1a("prod/api.v2") mod 256 = 203: the slot is part of the contract, stable.
        assert_eq!(s, "aware.v1.obs.203.prod.api_v2");
        let p = parse(&s).unwrap();
        assert_eq!(p.kind, EventKind::Obs);
        assert_eq!(p.target, t);
        assert_eq!(
            filter(Some(EventKind::Obs), Some("prod"), Some("api.v2")).unwrap(),
            s
        );
    }

    #[test]
    fn a_subject_whose_slot_is_not_its_targets_is_refused() {
        for bad in [
            "aware.v1.obs.204.prod.api_v2",
            "aware.v1.obs.0203.prod.api_v2",
            "aware.v1.obs.+203.prod.api_v2",
            "aware.v1.obs.*.prod.api_v2",
        ] {
            assert!(
                matches!(
                    parse(bad),
                    Err(SubjectError::WrongSlot { expected: 203, .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_unslotted_layout_parses_for_the_upgrade_read() {
        let t = Target::new("prod", "api.v2");
        let old = unslotted_subject(EventKind::Lifecycle, &t).unwrap();
        assert_eq!(old, "aware.v1.lifecycle.prod.api_v2");
        let p = parse_unslotted(&old).unwrap();
        assert_eq!(p.kind, EventKind::Lifecycle);
        assert_eq!(p.target, Target::new("prod", "api.v2"));
        assert!(parse("aware.v1.lifecycle.prod.api_v2").is_err());
        assert!(parse_unslotted("aware.v1.lifecycle.203.prod.api_v2").is_err());
        assert_eq!(
            unslotted_kind_filter(EventKind::Lifecycle),
            "aware.v1.lifecycle.*.*"
        );
    }

    #[test]
    fn targets_spread_over_every_slot() {
        let mut per_slot = vec![0u32; SLOTS as usize];
        for i in 0..25_600 {
            per_slot[slot(&Target::new("ns", format!("app-{i}"))) as usize] += 1;
        }
        // 100 per slot expected; a binomial's spread stays well inside these bounds.
        assert!(
            per_slot.iter().all(|&n| (50..=150).contains(&n)),
            "{per_slot:?}"
        );
    }

    #[test]
    fn a_slot_is_the_stable_hash_of_the_key_modulo_the_slots() {
        // The slot is part of the contract: other implementations compute it from the key.
        for (ns, name) in [
            ("ns", "web"),
            ("shop", "app-00017"),
            ("", ""),
            ("a.b", "c-d"),
        ] {
            let t = Target::new(ns, name);
            assert_eq!(
                u64::from(slot(&t)),
                stable_hash(&t.key()) % u64::from(SLOTS)
            );
        }
        // FNV-1a's published value for "a", so the hash itself cannot drift either.
        assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn every_kind_round_trips() {
        let t = Target::new("ns", "web");
        for k in EventKind::ALL {
            let p = parse(&subject(k, &t).unwrap()).unwrap();
            assert_eq!(p.kind, k);
        }
    }

    #[test]
    fn filters_use_wildcards() {
        assert_eq!(filter(None, None, None).unwrap(), "aware.v1.*.*.*.*");
        assert_eq!(
            filter(Some(EventKind::Action), Some("ns"), None).unwrap(),
            "aware.v1.action.*.ns.*"
        );
        assert_eq!(kind_filter(EventKind::Model), "aware.v1.model.*.*.*");
        assert_eq!(slot_filter(EventKind::Model, 7), "aware.v1.model.7.*.*");
    }

    #[test]
    fn rejects_bad_names_and_subjects() {
        assert!(subject(EventKind::Obs, &Target::new("", "x")).is_err());
        assert!(subject(EventKind::Obs, &Target::new("a b", "x")).is_err());
        assert!(subject(EventKind::Obs, &Target::new("ns", "x*")).is_err());
        assert!(subject(EventKind::Obs, &Target::new("ns", "x_y")).is_err());
        assert!(matches!(
            parse("aware.v1.obs.ns"),
            Err(SubjectError::NotAware(_))
        ));
        assert!(matches!(
            parse("aware.v1.obs.0.ns.a.b"),
            Err(SubjectError::NotAware(_))
        ));
        assert!(matches!(
            parse("aware.v1.nope.0.ns.a"),
            Err(SubjectError::UnknownEvent { .. })
        ));
        assert!(matches!(
            parse("other.v1.obs.0.ns.a"),
            Err(SubjectError::NotAware(_))
        ));
    }
}
