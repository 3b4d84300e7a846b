//! MessagePack named-map codec (`rmp_serde::to_vec_named`).
//!
//! Decoding never panics: garbage, truncated input, trailing bytes, a message that is not a map, a
//! wrong or unknown schema each return a typed [`DecodeError`].

use std::io::Cursor;

use serde::Deserialize;

use crate::{
    Action, Applied, BusMessage, Embedding, Episode, Event, EventKind, Lifecycle, Model, Obs,
    Registration,
};

/// Errors from encoding a message.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("cannot encode {kind} message: {source}")]
    MessagePack {
        kind: EventKind,
        #[source]
        source: rmp_serde::encode::Error,
    },
}

/// Errors from decoding a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty message")]
    Empty,
    #[error("message is not a MessagePack map (first byte {0:#04x})")]
    NotAMap(u8),
    #[error("message has no readable `schema` field: {0}")]
    NoSchema(String),
    #[error("unknown message type in schema `{0}`")]
    UnknownKind(String),
    #[error("schema `{found}` where `{expected}` was expected")]
    WrongSchema {
        expected: &'static str,
        found: String,
    },
    #[error("unsupported schema version in `{found}` (this build reads `{supported}`)")]
    UnsupportedVersion {
        found: String,
        supported: &'static str,
    },
    #[error("malformed {kind} message: {reason}")]
    Malformed { kind: EventKind, reason: String },
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
}

/// Encodes a message as a MessagePack map with named fields.
pub fn encode<M: BusMessage>(msg: &M) -> Result<Vec<u8>, EncodeError> {
    rmp_serde::to_vec_named(msg).map_err(|source| EncodeError::MessagePack {
        kind: M::KIND,
        source,
    })
}

/// Encodes any event.
pub fn encode_event(ev: &Event) -> Result<Vec<u8>, EncodeError> {
    match ev {
        Event::Obs(m) => encode(m),
        Event::Action(m) => encode(m),
        Event::Applied(m) => encode(m),
        Event::Episode(m) => encode(m),
        Event::Lifecycle(m) => encode(m),
        Event::Embedding(m) => encode(m),
        Event::Model(m) => encode(m),
        Event::Registration(m) => encode(m),
    }
}

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow)]
    schema: std::borrow::Cow<'a, str>,
}

/// Reads the `schema` field and returns the kind it names and the full schema string.
pub fn probe(bytes: &[u8]) -> Result<(EventKind, String), DecodeError> {
    let first = *bytes.first().ok_or(DecodeError::Empty)?;
    let is_map = matches!(first, 0x80..=0x8f | 0xde | 0xdf);
    if !is_map {
        return Err(DecodeError::NotAMap(first));
    }
    let p: Probe<'_> =
        rmp_serde::from_slice(bytes).map_err(|e| DecodeError::NoSchema(e.to_string()))?;
    let schema = p.schema.into_owned();
    let kind_token = schema.split('/').next().unwrap_or_default();
    let kind = EventKind::from_token(kind_token)
        .ok_or_else(|| DecodeError::UnknownKind(schema.clone()))?;
    Ok((kind, schema))
}

fn check_schema<M: BusMessage>(bytes: &[u8]) -> Result<(), DecodeError> {
    let (kind, schema) = probe(bytes)?;
    if kind != M::KIND {
        return Err(DecodeError::WrongSchema {
            expected: M::SCHEMA,
            found: schema,
        });
    }
    if schema != M::SCHEMA {
        return Err(DecodeError::UnsupportedVersion {
            found: schema,
            supported: M::SCHEMA,
        });
    }
    Ok(())
}

/// Decodes one message of type `M`, checking its schema.
pub fn decode<M: BusMessage>(bytes: &[u8]) -> Result<M, DecodeError> {
    check_schema::<M>(bytes)?;
    let mut cursor = Cursor::new(bytes);
    let msg = {
        let mut de = rmp_serde::Deserializer::new(&mut cursor);
        M::deserialize(&mut de).map_err(|e| DecodeError::Malformed {
            kind: M::KIND,
            reason: e.to_string(),
        })?
    };
    let consumed = usize::try_from(cursor.position()).unwrap_or(usize::MAX);
    if consumed < bytes.len() {
        return Err(DecodeError::TrailingBytes(bytes.len() - consumed));
    }
    Ok(msg)
}

/// Decodes a message expected to be of `kind` (e.g. the kind named by its subject).
pub fn decode_event(kind: EventKind, bytes: &[u8]) -> Result<Event, DecodeError> {
    Ok(match kind {
        EventKind::Obs => Event::Obs(decode::<Obs>(bytes)?),
        EventKind::Action => Event::Action(decode::<Action>(bytes)?),
        EventKind::Applied => Event::Applied(decode::<Applied>(bytes)?),
        EventKind::Episode => Event::Episode(decode::<Episode>(bytes)?),
        EventKind::Lifecycle => Event::Lifecycle(decode::<Lifecycle>(bytes)?),
        EventKind::Embedding => Event::Embedding(decode::<Embedding>(bytes)?),
        EventKind::Model => Event::Model(decode::<Model>(bytes)?),
        EventKind::Target => Event::Registration(decode::<Registration>(bytes)?),
    })
}

/// Decodes any message, dispatching on its `schema` field.
pub fn decode_any(bytes: &[u8]) -> Result<Event, DecodeError> {
    let (kind, _) = probe(bytes)?;
    decode_event(kind, bytes)
}

/// The JSON form of an event (same field names as on the bus), as printed by `aware watch`.
pub fn to_json(ev: &Event) -> serde_json::Value {
    // Serializing plain data structs to a JSON value cannot fail; non-finite floats become null.
    serde_json::to_value(ev).unwrap_or(serde_json::Value::Null)
}
