//! `--help`: headings and the order of options.

use crate::common::*;

#[test]
fn help_lists_global_options_after_the_commands_own() {
    let db = TestDb::new(Backend::Sqlite);
    let r = db.dlq(&["replay", "--help"]);
    assert_eq!(r.code, 0);
    let own = r.stdout.find("--lease").expect("replay's own option");
    let heading = r.stdout.find("Global Options:").expect("a heading");
    let global = r.stdout.find("--database-url").expect("a global option");
    assert!(own < heading && heading < global, "{}", r.stdout);
    // The global options are not listed among the command's own.
    let options = r.stdout.find("\nOptions:").expect("own options");
    assert!(
        !r.stdout[options..heading].contains("--database-url"),
        "{}",
        r.stdout
    );
}
