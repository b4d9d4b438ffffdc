//! What a libFuzzer run printed: executions, coverage, peak memory.

/// The figures of one libFuzzer run, from its log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunStats {
    /// Inputs run (`stat::number_of_executed_units`, else the last `#N`).
    pub executions: u64,
    /// Covered code edges (`cov:` of the last status line).
    pub cov: u64,
    /// Coverage features (`ft:` of the last status line).
    pub ft: u64,
    /// Inputs in the corpus at the end (`corp:` of the last status line).
    pub corpus: u64,
    /// Peak resident memory in MB (`stat::peak_rss_mb`).
    pub peak_rss_mb: u64,
}

/// Reads the figures from a libFuzzer log: the last status line
/// (`#1234\tDONE   cov: 456 ft: 789 corp: 12/3456b ...`) and the final
/// `stat::` lines of `-print_final_stats=1`. Figures absent from the log stay 0.
pub fn parse(log: &str) -> RunStats {
    let mut stats = RunStats::default();
    for line in log.lines() {
        if let Some(count) = line.strip_prefix('#') {
            let status = count.split_whitespace().collect::<Vec<_>>();
            if let Some(n) = status.first().and_then(|n| n.parse().ok()) {
                stats.executions = n;
            }
            if let Some(cov) = field(&status, "cov:") {
                stats.cov = cov;
            }
            if let Some(ft) = field(&status, "ft:") {
                stats.ft = ft;
            }
            if let Some(corpus) = field(&status, "corp:") {
                stats.corpus = corpus;
            }
        } else if let Some(n) = stat(line, "stat::number_of_executed_units:") {
            stats.executions = n;
        } else if let Some(n) = stat(line, "stat::peak_rss_mb:") {
            stats.peak_rss_mb = n;
        }
    }
    stats
}

/// The number after `name` in a status line's words (`corp: 12/3456b` gives 12).
fn field(words: &[&str], name: &str) -> Option<u64> {
    let at = words.iter().position(|w| *w == name)?;
    let value = words.get(at + 1)?;
    value.split('/').next()?.parse().ok()
}

/// The number of a `stat::name: N` line.
fn stat(line: &str, prefix: &str) -> Option<u64> {
    line.trim().strip_prefix(prefix)?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
INFO: Seed: 123
#2\tINITED cov: 1085 ft: 1090 corp: 1/1b exec/s: 0 rss: 45Mb
#1024\tpulse  cov: 1300 ft: 2100 corp: 40/900b lim: 14 exec/s: 512 rss: 60Mb
#71810\tNEW    cov: 1310 ft: 2230 corp: 52/1207b lim: 1024 exec/s: 2393 rss: 88Mb L: 22/300 MS: 1 ChangeBit-
#90001\tDONE   cov: 1311 ft: 2234 corp: 53/1210b lim: 1024 exec/s: 2903 rss: 90Mb
Done 90001 runs in 31 second(s)
stat::number_of_executed_units: 90001
stat::average_exec_per_sec:     2903
stat::new_units_added:          51
stat::slowest_unit_time_sec:    0
stat::peak_rss_mb:              90
";

    #[test]
    fn reads_the_last_status_line_and_the_final_stats() {
        assert_eq!(
            parse(LOG),
            RunStats {
                executions: 90001,
                cov: 1311,
                ft: 2234,
                corpus: 53,
                peak_rss_mb: 90,
            }
        );
    }

    #[test]
    fn a_crash_before_the_final_stats_keeps_the_last_status() {
        let log = "#5000\tNEW    cov: 200 ft: 300 corp: 9/99b exec/s: 0 rss: 30Mb\n\
                   ==123== ERROR: libFuzzer: deadly signal\n";
        let stats = parse(log);
        assert_eq!((stats.executions, stats.cov, stats.ft), (5000, 200, 300));
        assert_eq!(stats.peak_rss_mb, 0);
    }

    #[test]
    fn an_empty_log_gives_zeros() {
        assert_eq!(parse(""), RunStats::default());
    }
}
