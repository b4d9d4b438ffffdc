//! REFRACT (`refract-llm`, pinned), pytest, and our REFRACT backend package
//! (`python/refract-gemma-mlx`, installed editable) in the reference Python
//! environment, for `refract-gemma-mlx` and its tests.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::command;
use crate::workspace::Workspace;

/// The REFRACT release the backend is written against.
pub const REFRACT_VERSION: &str = "0.3.2.3";

/// Prints the installed versions and where our package is imported from.
const PROBE: &str = "import json, importlib.metadata as m, refract_gemma_mlx, pytest; \
    print(json.dumps({'refract': m.version('refract-llm'), \
    'package': refract_gemma_mlx.__file__}))";

/// What [`PROBE`] prints.
#[derive(Debug, Deserialize)]
struct Installed {
    refract: String,
    package: String,
}

/// Makes sure `python` imports REFRACT at [`REFRACT_VERSION`], pytest and
/// this checkout's backend package, installing them as needed. Returns a
/// line for the setup summary.
pub fn ensure(workspace: &Workspace, python: &Path) -> Result<String> {
    let package = workspace.root().join("python/refract-gemma-mlx");
    let ready = |installed: &Installed| {
        installed.refract == REFRACT_VERSION && Path::new(&installed.package).starts_with(&package)
    };
    if probe(python).as_ref().is_some_and(ready) {
        println!("REFRACT: already set up");
    } else {
        let editable = package.to_string_lossy();
        let mut pip = Command::new(python);
        pip.args(["-m", "pip", "install", "--progress-bar", "on"])
            .arg(format!("refract-llm=={REFRACT_VERSION}"))
            .args(["pytest", "-e", &editable])
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1");
        command::run(&mut pip).with_context(|| {
            format!("pip could not install refract-llm=={REFRACT_VERSION} and {editable}; it needs network access to PyPI")
        })?;
        probe(python).filter(ready).with_context(|| {
            format!(
                "{} still does not import refract-llm {REFRACT_VERSION} and {editable}",
                python.display()
            )
        })?;
    }
    Ok(format!(
        "refract-llm {REFRACT_VERSION} with refract-gemma-mlx ({})",
        package.display()
    ))
}

fn probe(python: &Path) -> Option<Installed> {
    let output = command::capture(Command::new(python).args(["-c", PROBE])).ok()?;
    if !output.status.success() {
        return None;
    }
    serde_json::from_slice(&output.stdout).ok()
}
