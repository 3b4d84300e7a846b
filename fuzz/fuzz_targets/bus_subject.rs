//! The subject parser (`bus-schemas` subject) and the bus's subject/pattern syntax
//! (`aware_shared::bus::pattern`), which both bus implementations use.
//!
//! Invariants: a parsed AWARE subject is rebuilt exactly from its kind and target, is a valid
//! subject to publish on, and is matched by its kind's filter, its slot's filter and by the
//! all-events filter; a valid publish subject is matched by itself as a pattern.
#![no_main]

use aware_bus_schemas::subject;
use aware_shared::bus::pattern::{validate_subject, Pattern};
use libfuzzer_sys::fuzz_target;

fn pattern(s: &str) -> Pattern {
    match Pattern::parse(s) {
        Ok(p) => p,
        Err(e) => panic!("filter `{s}` is not a pattern: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parsed) = subject::parse(s) {
        match subject::subject(parsed.kind, &parsed.target) {
            Ok(built) => assert_eq!(built, s, "parse → subject is not the identity"),
            Err(e) => panic!("the target parsed from `{s}` forms no subject: {e}"),
        }
        if let Err(e) = validate_subject(s) {
            panic!("parsed AWARE subject `{s}` cannot be published: {e}");
        }
        assert!(pattern(&subject::kind_filter(parsed.kind)).matches(s));
        let slot = subject::slot(&parsed.target);
        assert!(pattern(&subject::slot_filter(parsed.kind, slot)).matches(s));
        assert!(pattern(subject::ALL).matches(s));
        let exact = subject::filter(
            Some(parsed.kind),
            Some(&parsed.target.namespace),
            Some(&parsed.target.name),
        );
        assert_eq!(
            exact.as_deref(),
            Ok(s),
            "the exact filter differs from the subject"
        );
    }
    if let Ok(p) = Pattern::parse(s) {
        if validate_subject(s).is_ok() {
            assert!(p.matches(s), "subject `{s}` does not match itself");
        }
    }
});
