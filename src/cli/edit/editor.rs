//! The body in `$VISUAL` / `$EDITOR`, as `kubectl edit` does: a buffer saved unchanged or
//! empty cancels; one that is not JSON (for a JSON body) opens again with the error on
//! top; nothing is written until the buffer is good.

use super::Result;
use dlq::error::DlqError;
use dlq::revise::{editor_error, editor_text};
use std::io::Write;

/// Lines dlq puts on top of a reopened buffer (a JSON text never starts with `#`).
const MARK: &str = "# dlq:";

/// The saved buffer, or None when the operator cancelled.
pub fn edit(body: &[u8]) -> Result<Option<String>> {
    let shown = editor_text(body).ok_or_else(|| {
        DlqError::usage("the body is not UTF-8 text: replace it with --body-file FILE")
    })?;
    let json = editor_error(body, "null").is_none();
    let mut buffer = shown.clone();
    let mut error: Option<String> = None;
    loop {
        let mut file = tempfile::Builder::new()
            .prefix("dlq-edit-")
            .suffix(if json { ".json" } else { ".txt" })
            .tempfile()
            .map_err(|e| DlqError::other(format!("cannot make a file for the editor: {e}")))?;
        let mut text = String::new();
        if let Some(e) = &error {
            text.push_str(&format!(
                "{MARK} this is not valid JSON: {e}\n{MARK} fix it and save, or empty the file to cancel; these lines are ignored\n"
            ));
        }
        text.push_str(&buffer);
        file.write_all(text.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| DlqError::other(format!("cannot write the file for the editor: {e}")))?;
        run_editor(file.path())?;
        let saved = std::fs::read_to_string(file.path())
            .map_err(|e| DlqError::other(format!("cannot read back the edited file: {e}")))?;
        let saved = match json {
            true => strip_marks(&saved),
            false => saved,
        };
        if saved.trim().is_empty() || saved == shown {
            return Ok(None);
        }
        match editor_error(body, &saved) {
            Some(e) => {
                error = Some(e);
                buffer = saved;
            }
            None => return Ok(Some(saved)),
        }
    }
}

fn strip_marks(saved: &str) -> String {
    let mut rest = saved;
    while rest.starts_with(MARK) {
        rest = rest.split_once('\n').map_or("", |(_, r)| r);
    }
    rest.to_string()
}

/// Runs `$VISUAL`, else `$EDITOR`, else `vi`, through the shell (it may carry flags:
/// `code --wait`), and waits for it.
fn run_editor(path: &std::path::Path) -> Result<()> {
    let editor = ["VISUAL", "EDITOR"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|e| !e.trim().is_empty()))
        .unwrap_or_else(|| "vi".into());
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("dlq-editor")
        .arg(path)
        .status()
        .map_err(|e| DlqError::other(format!("cannot start the editor {editor:?}: {e}")))?;
    if !status.success() {
        return Err(DlqError::other(format!(
            "the editor {editor:?} failed ({status}); nothing was written"
        ))
        .into());
    }
    Ok(())
}
