//! Child processes: signals, config files, waiting for what they do.

use super::TestDb;
use std::ffi::OsStr;
use std::process::{Child, Command, Stdio};

/// Sends a signal to a child process.
pub fn signal(child: &std::process::Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Polls `f` every 50 ms until it holds; fails the test after `secs` seconds.
pub fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Writes `body` as the dlq config file under the XDG config home `dir`.
pub fn write_config(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    let p = dir.join("dlq").join("config.toml");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    p
}

impl TestDb {
    /// `dlq ARGS` started with stdout and stderr piped, for a test that acts while it runs.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.spawn_env::<&str, &str>(args, &[])
    }

    /// [`TestDb::spawn`] with these variables set (a URL through a proxy, say).
    pub fn spawn_env<K: AsRef<OsStr>, V: AsRef<OsStr>>(
        &self,
        args: &[&str],
        env: &[(K, V)],
    ) -> Child {
        let mut c = self.cmd();
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// `dlq replay --plan PLAN --yes EXTRA` started (see [`TestDb::spawn_env`]).
    pub fn spawn_plan<K: AsRef<OsStr>, V: AsRef<OsStr>>(
        &self,
        plan: &tempfile::NamedTempFile,
        extra: &[&str],
        env: &[(K, V)],
    ) -> Child {
        let mut args = vec!["replay", "--plan", plan.path().to_str().unwrap(), "--yes"];
        args.extend_from_slice(extra);
        self.spawn_env(&args, env)
    }
}

/// Runs `dlq ARGS` on a pseudo-terminal (util-linux `script`), typing `input` (`"\x03"`
/// is Ctrl-C); `TERM=dumb`, 200 columns, stdout and stderr both on the terminal (`stdout`).
pub fn on_a_terminal(db: &TestDb, env: &[(&str, &str)], args: &str, input: &str) -> super::Run {
    on_a_terminal_typing(db, env, args, &[input])
}

/// [`on_a_terminal`], typing each input 1.5 s after the one before.
pub fn on_a_terminal_typing(
    db: &TestDb,
    env: &[(&str, &str)],
    args: &str,
    inputs: &[&str],
) -> super::Run {
    let bin = env!("CARGO_BIN_EXE_dlq");
    let mut c = db.cmd();
    c.env("COLUMNS", "200");
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c
        .env_remove("DLQ_OUTPUT")
        .env("TERM", "dumb")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_script(bin, args);
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    for input in inputs {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // The child may be gone already: what it printed says why.
        let _ = stdin.write_all(input.as_bytes());
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    drop(stdin);
    super::Run::from(child.wait_with_output().unwrap())
}

trait SpawnScript {
    fn spawn_script(&mut self, bin: &str, args: &str) -> std::process::Child;
}

impl SpawnScript for std::process::Command {
    fn spawn_script(&mut self, bin: &str, args: &str) -> std::process::Child {
        let mut c = std::process::Command::new("script");
        c.args(["-qefc", &format!("{bin} {args}"), "/dev/null"]);
        for (k, v) in self.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}
