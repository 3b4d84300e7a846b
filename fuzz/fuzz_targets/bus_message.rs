//! Every bus decoder (`bus-schemas` codec): the first byte picks the kind a subject would name,
//! the rest is the payload, decoded both by that kind (`decode_event`, what the services do after
//! parsing the subject) and by its own `schema` field (`decode_any`).
//!
//! Invariants: the two decoders agree; a decoded message re-encodes, and decode → encode is a
//! fixed point (the re-encoded bytes decode to a message that encodes to the same bytes).
#![no_main]

use aware_bus_schemas::{codec, decode_any, decode_event, encode_event, EventKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, payload)) = data.split_first() else {
        return;
    };
    let kind = EventKind::ALL[usize::from(selector) % EventKind::ALL.len()];
    let by_kind = decode_event(kind, payload);
    let any = decode_any(payload);
    match (&by_kind, &any) {
        (Ok(a), Ok(b)) => assert_eq!(
            encode_event(a).ok(),
            encode_event(b).ok(),
            "decode_event and decode_any read the same bytes differently"
        ),
        (Ok(_), Err(e)) => panic!("decoded as {kind}, but decode_any refuses it: {e}"),
        (Err(_), Ok(ev)) => assert_ne!(
            ev.kind(),
            kind,
            "decode_any reads a {kind} message that decode_event refuses"
        ),
        (Err(_), Err(_)) => {}
    }
    let Ok(event) = any else {
        return;
    };
    let encoded = match encode_event(&event) {
        Ok(b) => b,
        Err(e) => panic!("a decoded {} message does not encode: {e}", event.kind()),
    };
    let again = match decode_event(event.kind(), &encoded) {
        Ok(ev) => ev,
        Err(e) => panic!("a re-encoded {} message does not decode: {e}", event.kind()),
    };
    match encode_event(&again) {
        Ok(b) => assert_eq!(b, encoded, "decode → encode is not a fixed point"),
        Err(e) => panic!(
            "a twice-decoded {} message does not encode: {e}",
            event.kind()
        ),
    }
    // `aware watch` prints every event as JSON.
    let _ = codec::to_json(&event);
});
