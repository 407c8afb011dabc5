//! Logging (`-v`, `DLQ_LOG`): tracing to stderr, every field through the sanitizer and
//! every line through [`scrub`], since a log line can quote a broker's or a database's
//! text and a URL with its password.

use dlq::secret::scrub;
use std::io::IsTerminal;

/// Log fields (messages, errors, SQL) pass through the sanitizer: a log line can quote
/// an error text or a value that came from the broker.
struct SanitizedFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for SanitizedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut buf = String::new();
        tracing_subscriber::fmt::format::DefaultFields::new().format_fields(
            tracing_subscriber::fmt::format::Writer::new(&mut buf),
            fields,
        )?;
        writer.write_str(&dlq::sanitize::block(&buf))
    }
}

pub(super) fn init_logging(verbose: u8) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, Registry};
    // DLQ_LOG takes a full tracing filter; the -v levels use a plain target list, which
    // costs nothing at start-up. Either filters globally: as a per-layer filter, EnvFilter
    // let some events through and silently dropped others.
    let filter: Box<dyn Layer<Registry> + Send + Sync> = match std::env::var("DLQ_LOG") {
        Ok(spec) => Box::new(tracing_subscriber::EnvFilter::new(spec)),
        Err(_) => Box::new(match verbose {
            0 => Targets::new()
                .with_default(LevelFilter::WARN)
                .with_target("lapin", LevelFilter::OFF)
                .with_target("amq_protocol", LevelFilter::OFF),
            1 => Targets::new()
                .with_default(LevelFilter::INFO)
                .with_target("dlq", LevelFilter::DEBUG)
                .with_target("lapin", LevelFilter::WARN),
            _ => Targets::new().with_default(LevelFilter::DEBUG),
        }),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .fmt_fields(SanitizedFields)
        .with_writer(ScrubbedStderr::default)
        .with_target(verbose > 1)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none());
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init();
}

/// Log lines pass through [`scrub`] before reaching stderr.
#[derive(Default)]
struct ScrubbedStderr {
    buf: Vec<u8>,
}

impl std::io::Write for ScrubbedStderr {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ScrubbedStderr {
    fn drop(&mut self) {
        let text = scrub(&String::from_utf8_lossy(&self.buf));
        let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
    }
}
