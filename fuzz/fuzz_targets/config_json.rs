//! `config.json` → [`Gemma3Config`].
//!
//! The input is the file. Invariants: parsing never panics; a configuration
//! it returns satisfies [`gemma_fuzz::config::check`]; reading the same
//! bytes from a file gives the same result, and bytes that are not UTF-8
//! are an I/O error (the file is read as text).

#![no_main]

use std::path::Path;

use gemma::config::{ConfigProblem, Gemma3Config};
use gemma_fuzz::scratch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match std::str::from_utf8(data) {
        Ok(text) => {
            let parsed = Gemma3Config::from_json_str(text, Path::new("config.json"));
            if let Ok(config) = &parsed {
                gemma_fuzz::config::check(config);
            }
            let path = scratch::write("config.json", data);
            let from_file = Gemma3Config::from_json_file(&path);
            match (&parsed, &from_file) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "text and file differ"),
                (Err(a), Err(b)) => assert_eq!(a.problem.to_string(), b.problem.to_string()),
                _ => panic!("text and file disagree: {parsed:?} vs {from_file:?}"),
            }
        }
        Err(_) => {
            let path = scratch::write("config.json", data);
            let error = Gemma3Config::from_json_file(&path).expect_err("not UTF-8");
            assert!(
                matches!(error.problem, ConfigProblem::Io(_)),
                "not UTF-8 but {error}"
            );
        }
    }
});
