//! NATS subject syntax, shared by both bus implementations so they agree exactly.
//!
//! A subject is a non-empty sequence of non-empty tokens separated by `.`, without whitespace.
//! A subscription pattern may use `*` (exactly one token) and, as its last token, `>` (one or more
//! tokens). Published subjects may not contain wildcards.

use super::BusError;

fn check_tokens(s: &str, what: &'static str) -> Result<(), BusError> {
    let bad = |reason: &'static str| {
        Err(BusError::InvalidSubject {
            subject: s.to_string(),
            what,
            reason,
        })
    };
    if s.is_empty() {
        return bad("is empty");
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("contains whitespace or control characters");
    }
    if s.split('.').any(str::is_empty) {
        return bad("has an empty token");
    }
    Ok(())
}

/// Validates a subject to publish on.
pub fn validate_subject(s: &str) -> Result<(), BusError> {
    check_tokens(s, "subject")?;
    if s.split('.').any(|t| t == "*" || t == ">") {
        return Err(BusError::InvalidSubject {
            subject: s.to_string(),
            what: "subject",
            reason: "wildcards are only allowed in subscriptions",
        });
    }
    Ok(())
}

/// A compiled subscription pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    tokens: Vec<Tok>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Lit(String),
    Star,
    Tail,
}

impl Pattern {
    pub fn parse(s: &str) -> Result<Self, BusError> {
        check_tokens(s, "pattern")?;
        let parts: Vec<&str> = s.split('.').collect();
        let mut tokens = Vec::with_capacity(parts.len());
        for (i, t) in parts.iter().enumerate() {
            tokens.push(match *t {
                "*" => Tok::Star,
                ">" if i + 1 == parts.len() => Tok::Tail,
                ">" => {
                    return Err(BusError::InvalidSubject {
                        subject: s.to_string(),
                        what: "pattern",
                        reason: "`>` must be the last token",
                    })
                }
                lit => Tok::Lit(lit.to_string()),
            });
        }
        Ok(Pattern { tokens })
    }

    /// Whether a (valid, wildcard-free) subject matches.
    pub fn matches(&self, subject: &str) -> bool {
        let mut parts = subject.split('.');
        for tok in &self.tokens {
            match tok {
                Tok::Tail => return parts.next().is_some(),
                Tok::Star => {
                    if parts.next().is_none() {
                        return false;
                    }
                }
                Tok::Lit(l) => {
                    if parts.next() != Some(l.as_str()) {
                        return false;
                    }
                }
            }
        }
        parts.next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_semantics() {
        let p = |s| Pattern::parse(s).unwrap();
        assert!(p("a.b.c").matches("a.b.c"));
        assert!(!p("a.b.c").matches("a.b"));
        assert!(!p("a.b.c").matches("a.b.c.d"));
        assert!(p("a.*.c").matches("a.x.c"));
        assert!(!p("a.*.c").matches("a.x.y.c"));
        assert!(p("a.>").matches("a.b"));
        assert!(p("a.>").matches("a.b.c.d"));
        assert!(!p("a.>").matches("a"));
        assert!(p("*").matches("a"));
        assert!(!p("*").matches("a.b"));
        assert!(p(">").matches("a.b"));
        assert!(p("*.b.>").matches("x.b.c"));
        assert!(!p("*.b.>").matches("x.c.c"));
    }

    #[test]
    fn rejects_malformed() {
        assert!(Pattern::parse("").is_err());
        assert!(Pattern::parse("a..b").is_err());
        assert!(Pattern::parse("a.>.b").is_err());
        assert!(Pattern::parse("a b").is_err());
        assert!(validate_subject("a.*").is_err());
        assert!(validate_subject("a.>").is_err());
        assert!(validate_subject(".a").is_err());
        assert!(validate_subject("a.b").is_ok());
    }
}
