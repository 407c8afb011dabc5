//! `sqlx::migrate!` embeds `migrations/` at compile time, and cargo does not watch those
//! files by itself: without this, a new migration is missed until a source file changes
//! (what `sqlx migrate build-script` writes).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
