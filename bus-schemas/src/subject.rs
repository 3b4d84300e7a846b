//! Subject builders and parsers (docs/design.md §2, contract).
//!
//! Every event travels on `aware.v1.<event>.<namespace>.<target>`. Kubernetes object names may
//! contain `.` (DNS-1123 subdomains) which is the NATS token separator, so a `.` in a namespace or
//! name is written as `_` in the subject. `_` never occurs in a Kubernetes name, so the mapping is
//! reversible.

use crate::{EventKind, Target};

/// Prefix of every AWARE subject, including the contract version.
pub const PREFIX: &str = "aware.v1";
/// Filter matching every AWARE event (used by the JetStream stream and `aware watch`).
pub const ALL: &str = "aware.v1.>";

/// Errors from building or parsing subjects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    #[error(
        "subject `{0}` is not an AWARE v1 subject (expected aware.v1.<event>.<namespace>.<target>)"
    )]
    NotAware(String),
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
        "{PREFIX}.{}.{}.{}",
        kind.as_str(),
        encode_token(&target.namespace),
        encode_token(&target.name)
    ))
}

/// A subscription filter: `None` parts become the `*` wildcard.
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
    Ok(format!(
        "{PREFIX}.{}.{}.{}",
        kind.map_or("*", EventKind::as_str),
        namespace.map_or_else(|| "*".to_string(), encode_token),
        name.map_or_else(|| "*".to_string(), encode_token),
    ))
}

/// The filter for every event of one kind, for every target.
pub fn kind_filter(kind: EventKind) -> String {
    format!("{PREFIX}.{}.*.*", kind.as_str())
}

/// A parsed AWARE subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSubject {
    pub kind: EventKind,
    pub target: Target,
}

/// Parses `aware.v1.<event>.<namespace>.<target>`.
pub fn parse(subject: &str) -> Result<ParsedSubject, SubjectError> {
    let mut parts = subject.split('.');
    let (Some("aware"), Some("v1"), Some(event), Some(ns), Some(name), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(SubjectError::NotAware(subject.to_string()));
    };
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
        assert_eq!(s, "aware.v1.obs.prod.api_v2");
        let p = parse(&s).unwrap();
        assert_eq!(p.kind, EventKind::Obs);
        assert_eq!(p.target, t);
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
        assert_eq!(filter(None, None, None).unwrap(), "aware.v1.*.*.*");
        assert_eq!(
            filter(Some(EventKind::Action), Some("ns"), None).unwrap(),
            "aware.v1.action.ns.*"
        );
        assert_eq!(kind_filter(EventKind::Model), "aware.v1.model.*.*");
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
            parse("aware.v1.obs.ns.a.b"),
            Err(SubjectError::NotAware(_))
        ));
        assert!(matches!(
            parse("aware.v1.nope.ns.a"),
            Err(SubjectError::UnknownEvent { .. })
        ));
        assert!(matches!(
            parse("other.v1.obs.ns.a"),
            Err(SubjectError::NotAware(_))
        ));
    }
}
