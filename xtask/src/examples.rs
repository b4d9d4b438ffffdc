//! The engine's examples (`crates/engine/examples`), which `cargo xtask
//! test` runs after the tests.

use std::path::Path;

use anyhow::{Context, Result};

/// The names of the examples in `dir`, sorted: the stems of its `*.rs`
/// files (the modules they share live in a subfolder, which is no example).
pub fn names(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    let mut names = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        let stem = path.file_stem().and_then(|s| s.to_str());
        match stem {
            Some(stem) if path.is_file() && path.extension().is_some_and(|e| e == "rs") => {
                names.push(stem.to_owned());
            }
            _ => {}
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::Workspace;

    #[test]
    fn lists_the_engine_examples_without_their_shared_module() {
        let workspace = Workspace::locate().unwrap();
        assert_eq!(
            names(&workspace.engine_examples()).unwrap(),
            [
                "chat_two_turns",
                "custom_processor",
                "kld_sweep",
                "stream_completion"
            ]
        );
    }

    #[test]
    fn a_missing_folder_is_an_error_naming_it() {
        let error = names(Path::new("/no/such/examples")).unwrap_err();
        assert_eq!(error.to_string(), "listing /no/such/examples");
    }
}
