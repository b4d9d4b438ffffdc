//! What AddressSanitizer and LeakSanitizer wrote: the errors, the leaks and
//! the suppressions used, read from the report files `log_path` makes.

/// One error or leak a sanitizer reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What went wrong: ASan's bug type (`heap-use-after-free`,
    /// `heap-buffer-overflow`, `SEGV`, ...) or `direct leak` / `indirect leak`.
    pub kind: String,
    /// The size involved: the access (`READ of size 8`) or the leak
    /// (`24 byte(s) in 1 object(s)`); empty when the report gives none.
    pub detail: String,
    /// The stack frames as `function file:line` (the first stack of the
    /// report: where the bad access happened, or where the leak was allocated).
    pub frames: Vec<String>,
}

impl Finding {
    /// The first frame in `ours` (paths of our sources), else the first frame
    /// outside the sanitizer's own interceptors, else `?`.
    pub fn where_in(&self, ours: &[&str]) -> &str {
        let mine = self
            .frames
            .iter()
            .find(|f| ours.iter().any(|o| f.contains(o)));
        let outside = || {
            self.frames
                .iter()
                .find(|f| !f.contains("compiler-rt") && !f.contains("asan_"))
        };
        mine.or_else(outside)
            .or(self.frames.first())
            .map_or("?", String::as_str)
    }
}

/// One line of LeakSanitizer's "Suppressions used" table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppressed {
    /// Allocations the suppression matched.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The suppression's pattern (from the suppressions file).
    pub pattern: String,
}

/// Everything in one report file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The errors and leaks, in the order reported.
    pub findings: Vec<Finding>,
    /// The leaks suppressions hid.
    pub suppressed: Vec<Suppressed>,
}

/// Reads a sanitizer report: `==PID==ERROR: AddressSanitizer: KIND ...`
/// blocks with their first stack, `Direct leak of N byte(s) in M object(s)
/// allocated from:` blocks (and indirect ones) with theirs, and the
/// `Suppressions used:` table. Anything else is ignored; a file with none of
/// these (a clean run writes no file at all) gives an empty report.
pub fn parse(text: &str) -> Report {
    let mut report = Report::default();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let line = line.trim();
        if let Some(kind) = asan_error(line) {
            let mut finding = Finding {
                kind,
                detail: String::new(),
                frames: Vec::new(),
            };
            // The access line (`READ of size 8 at ...`) may precede the stack.
            while let Some(next) = lines.peek() {
                let next = next.trim();
                if next.starts_with("#0 ") {
                    break;
                }
                if let Some(access) = access(next) {
                    finding.detail = access;
                }
                if next.is_empty() || next.starts_with("SUMMARY:") || next.starts_with("==") {
                    break;
                }
                lines.next();
            }
            finding.frames = stack(&mut lines);
            report.findings.push(finding);
        } else if let Some((kind, detail)) = leak(line) {
            report.findings.push(Finding {
                kind,
                detail,
                frames: stack(&mut lines),
            });
        } else if line == "Suppressions used:" {
            report.suppressed = suppressions(&mut lines);
        }
    }
    report
}

/// `heap-use-after-free` from `==123==ERROR: AddressSanitizer: heap-use-after-free on address ...`.
/// LeakSanitizer's own header (`ERROR: LeakSanitizer: detected memory
/// leaks`) is not one: its leaks follow as blocks of their own.
fn asan_error(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("ERROR: AddressSanitizer: ")?;
    let kind = rest.split_whitespace().next()?;
    Some(kind.trim_end_matches(':').to_string())
}

/// `READ of size 8` from `READ of size 8 at 0x602000000010 thread T1`.
fn access(line: &str) -> Option<String> {
    let (what, _) = line.split_once(" at 0x")?;
    (what.starts_with("READ of size") || what.starts_with("WRITE of size"))
        .then(|| what.to_string())
}

/// (`direct leak`, `24 byte(s) in 1 object(s)`) from `Direct leak of 24
/// byte(s) in 1 object(s) allocated from:`.
fn leak(line: &str) -> Option<(String, String)> {
    let (kind, rest) = line
        .strip_prefix("Direct leak of ")
        .map(|rest| ("direct leak", rest))
        .or_else(|| {
            line.strip_prefix("Indirect leak of ")
                .map(|rest| ("indirect leak", rest))
        })?;
    let detail = rest.strip_suffix(" allocated from:").unwrap_or(rest);
    Some((kind.to_string(), detail.to_string()))
}

/// The frames of the stack starting at the next line (`#0 0x... in f
/// file:line`), as `f file:line`; stops at the first line that is not a frame.
fn stack<'a>(lines: &mut std::iter::Peekable<impl Iterator<Item = &'a str>>) -> Vec<String> {
    let mut frames = Vec::new();
    while let Some(line) = lines.peek() {
        let line = line.trim();
        if !line.starts_with('#') {
            break;
        }
        frames.push(frame(line));
        lines.next();
    }
    frames
}

/// `f file:line` from `#3 0x55d0c0 in f file:line`; the module and offset
/// from `#3 0x55d0c0  (/lib/libmlx.so+0x1234)` when unsymbolized.
fn frame(line: &str) -> String {
    let mut words = line.splitn(3, char::is_whitespace);
    let _number = words.next();
    let _pc = words.next();
    let rest = words.next().unwrap_or_default().trim();
    rest.strip_prefix("in ").unwrap_or(rest).to_string()
}

/// The rows of the `Suppressions used:` table, up to its closing rule.
fn suppressions<'a>(lines: &mut impl Iterator<Item = &'a str>) -> Vec<Suppressed> {
    let mut used = Vec::new();
    for line in lines {
        let line = line.trim();
        if line.starts_with("---") {
            break;
        }
        let mut words = line.split_whitespace();
        let (Some(count), Some(bytes)) = (words.next(), words.next()) else {
            continue;
        };
        let (Ok(count), Ok(bytes)) = (count.parse(), bytes.parse()) else {
            continue; // the header row
        };
        used.push(Suppressed {
            count,
            bytes,
            pattern: words.collect::<Vec<_>>().join(" "),
        });
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    const USE_AFTER_FREE: &str = "\
=================================================================
==4242==ERROR: AddressSanitizer: heap-use-after-free on address 0x503000001234 at pc 0x55d0c0 bp 0x7ffd sp 0x7ffc
READ of size 8 at 0x503000001234 thread T1
    #0 0x55d0c0 in mlx_array_ndim /w/mlx-c/src/core.cpp:120:10
    #1 0x55d0c1 in sanitizer_canary::canary_handle_used_after_free::h12 /w/crates/mlx-core/tests/sanitizer_canary.rs:44:9
    #2 0x7f0000  (/lib/x86_64-linux-gnu/libc.so.6+0x29d8f)

0x503000001234 is located 4 bytes inside of 16-byte region [0x503000001230,0x503000001240)
freed by thread T1 here:
    #0 0x55d000 in operator delete(void*, unsigned long) /rustc/llvm/compiler-rt/lib/asan/asan_new_delete.cpp:164:3
    #1 0x55d0c2 in mlx_array_free /w/mlx-c/src/core.cpp:60:3

SUMMARY: AddressSanitizer: heap-use-after-free /w/mlx-c/src/core.cpp:120:10 in mlx_array_ndim
==4242==ABORTING
";

    const LEAKS: &str = "\
=================================================================
==77==ERROR: LeakSanitizer: detected memory leaks

Direct leak of 16 byte(s) in 1 object(s) allocated from:
    #0 0x55a1 in operator new(unsigned long) /rustc/llvm/compiler-rt/lib/asan/asan_new_delete.cpp:86:3
    #1 0x55a2 in mlxc::put(mlx_array_s**, mlx::core::array) /w/mlx-c/src/internal.h:125:26
    #2 0x55a3 in mlx_array_from_data /w/mlx-c/src/core.cpp:90:5
    #3 0x55a4 in mlx_core::array::Array::from_slice::h1 /w/crates/mlx-core/src/array.rs:147:9

Indirect leak of 12 byte(s) in 1 object(s) allocated from:
    #0 0x55b1 in malloc /rustc/llvm/compiler-rt/lib/asan/asan_malloc_linux.cpp:67:3
    #1 0x55b2  (/m/lib/libmlx.so+0x1ee63a)

-----------------------------------------------------
Suppressions used:
  count      bytes template
      2       4096 mlx::core::scheduler::Scheduler::Scheduler
-----------------------------------------------------

SUMMARY: AddressSanitizer: 28 byte(s) leaked in 2 allocation(s).
";

    #[test]
    fn an_asan_error_gives_its_kind_access_and_first_stack() {
        let report = parse(USE_AFTER_FREE);
        assert_eq!(report.findings.len(), 1, "{report:?}");
        let finding = &report.findings[0];
        assert_eq!(finding.kind, "heap-use-after-free");
        assert_eq!(finding.detail, "READ of size 8");
        assert_eq!(finding.frames.len(), 3, "only the access's stack");
        assert_eq!(
            finding.frames[0],
            "mlx_array_ndim /w/mlx-c/src/core.cpp:120:10"
        );
        assert_eq!(
            finding.frames[2],
            "(/lib/x86_64-linux-gnu/libc.so.6+0x29d8f)"
        );
        assert!(report.suppressed.is_empty());
    }

    #[test]
    fn leaks_are_findings_each_with_its_allocation_stack() {
        let report = parse(LEAKS);
        let kinds: Vec<(&str, &str)> = report
            .findings
            .iter()
            .map(|f| (f.kind.as_str(), f.detail.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("direct leak", "16 byte(s) in 1 object(s)"),
                ("indirect leak", "12 byte(s) in 1 object(s)"),
            ]
        );
        assert_eq!(report.findings[0].frames.len(), 4);
        assert_eq!(report.findings[1].frames.len(), 2);
    }

    #[test]
    fn the_suppressions_table_is_read() {
        assert_eq!(
            parse(LEAKS).suppressed,
            [Suppressed {
                count: 2,
                bytes: 4096,
                pattern: "mlx::core::scheduler::Scheduler::Scheduler".into(),
            }]
        );
    }

    #[test]
    fn where_names_the_first_frame_in_our_code() {
        let report = parse(LEAKS);
        let ours = ["/mlx-c/", "/crates/"];
        assert_eq!(
            report.findings[0].where_in(&ours),
            "mlxc::put(mlx_array_s**, mlx::core::array) /w/mlx-c/src/internal.h:125:26"
        );
        // No frame of ours: the first one past the allocator's interceptor.
        assert_eq!(
            report.findings[1].where_in(&ours),
            "(/m/lib/libmlx.so+0x1ee63a)"
        );
    }

    #[test]
    fn a_report_of_nothing_known_is_empty() {
        assert_eq!(parse(""), Report::default());
        assert_eq!(parse("==1==WARNING: something\n"), Report::default());
    }
}
