//! Large bodies: byte-for-byte through import, show and replay, read after the claim in
//! slices, and bodies that come inline with the claim.

mod inline;
mod reads;
mod round_trip;
mod slices;
