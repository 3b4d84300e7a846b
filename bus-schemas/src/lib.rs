//! The AWARE bus contract (DESIGN §2): message types, subjects, the MessagePack codec, generated
//! JSON Schemas and golden fixtures.
//!
//! External tools need none of this crate: messages are MessagePack maps with the field names
//! documented here and in `bus-schemas/schemas/*.schema.json`.

pub mod codec;
pub mod generated;
mod messages;
pub mod subject;

pub use codec::{decode, decode_any, decode_event, encode, encode_event, DecodeError, EncodeError};
pub use messages::*;

#[cfg(test)]
mod tests;
