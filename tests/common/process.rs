//! Child processes: signals, config files.

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
