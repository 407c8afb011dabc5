//! The broker side that replay and capture share: opening a connection ([`connect`]), the
//! header codec in both directions ([`codec`]) and the reading of the broker's answers by
//! reply code ([`reply`]). Neither
//! knows about rows or the replay protocol, so both `publisher` and `capture` can use them
//! without using each other.

pub mod codec;
pub mod connect;
pub mod reply;
