//! Prompts files of `gemma-mlx kld --prompts` / `trajectory`: one JSON
//! object `{"prompt": …, "chat": …}` per line.
//!
//! The input is the file. Invariants: bytes that are not UTF-8 are refused
//! before parsing (the command reads the file as text); parsing never
//! panics; a parsed file has one prompt per non-blank line, each of which
//! parses alone to the same prompt and survives writing back as JSON; an
//! error names the file.

#![no_main]

use engine::kld::trajectory::parse_prompts;
use libfuzzer_sys::fuzz_target;

const FILE: &str = "prompts.jsonl";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let prompts = match parse_prompts(text, FILE) {
        Ok(prompts) => prompts,
        Err(e) => {
            assert!(e.to_string().contains(FILE), "{e}");
            return;
        }
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(prompts.len(), lines.len(), "one prompt per non-blank line");
    for (prompt, line) in prompts.iter().zip(lines) {
        let alone = parse_prompts(line, FILE).expect("a line that parsed in the file");
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].prompt, prompt.prompt);
        assert_eq!(alone[0].chat, prompt.chat);
        let written = serde_json::json!({"prompt": prompt.prompt, "chat": prompt.chat});
        let back = parse_prompts(&written.to_string(), FILE).expect("written back");
        assert_eq!(
            (&back[0].prompt, back[0].chat),
            (&prompt.prompt, prompt.chat)
        );
    }
});
