//! The layer sets of a KV policy (`BASE;LAYERS:SETTINGS;…`): which layers a
//! part of a spec applies to. `LAYERS` is a comma list of indices
//! (`3`), ranges (`0-1`), `global` (the full-attention layers), `local`
//! (the sliding-window layers), `firstN` and `lastN`.

use std::fmt;

use gemma::config::Gemma3Config;

/// A set of layers named in a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerSet {
    /// Layers `first..=last` (one layer when they are equal).
    Range {
        /// The first index.
        first: usize,
        /// The last index, included.
        last: usize,
    },
    /// The global (full-attention) layers.
    Global,
    /// The sliding-window layers.
    Local,
    /// The first `n` layers.
    First(usize),
    /// The last `n` layers.
    Last(usize),
}

impl LayerSet {
    /// The set a name stands for, or why it is not one.
    pub fn parse(text: &str) -> Result<LayerSet, String> {
        let count = |digits: &str| -> Result<usize, String> {
            match digits.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "'{text}' needs a layer count of at least 1 after its name"
                )),
            }
        };
        let index = |digits: &str| -> Result<usize, String> {
            digits.trim().parse::<usize>().map_err(|_| {
                format!(
                    "'{text}' is not a layer set (accepted: an index such as 3, a range such \
                     as 0-1, global, local, firstN, lastN)"
                )
            })
        };
        Ok(match text {
            "global" => LayerSet::Global,
            "local" => LayerSet::Local,
            _ if text.starts_with("first") => LayerSet::First(count(&text[5..])?),
            _ if text.starts_with("last") => LayerSet::Last(count(&text[4..])?),
            _ => {
                let (first, last) = match text.split_once('-') {
                    Some((a, b)) => (index(a)?, index(b)?),
                    None => {
                        let i = index(text)?;
                        (i, i)
                    }
                };
                if last < first {
                    return Err(format!("range '{text}' runs backwards"));
                }
                LayerSet::Range { first, last }
            }
        })
    }

    /// Whether layer `index` of the model `config` describes is in the set.
    pub fn contains(self, index: usize, config: &Gemma3Config) -> bool {
        let layers = config.num_hidden_layers;
        match self {
            LayerSet::Range { first, last } => (first..=last).contains(&index),
            LayerSet::Global => !config.is_sliding(index),
            LayerSet::Local => config.is_sliding(index),
            LayerSet::First(n) => index < n,
            LayerSet::Last(n) => index + n >= layers,
        }
    }

    /// Checks that the set names only layers the model has.
    pub fn check(self, config: &Gemma3Config) -> Result<(), String> {
        let layers = config.num_hidden_layers;
        let past = match self {
            LayerSet::Range { last, .. } => last >= layers,
            LayerSet::First(n) | LayerSet::Last(n) => n > layers,
            LayerSet::Global | LayerSet::Local => false,
        };
        if past {
            return Err(format!(
                "'{self}' names layers past the model's last (it has {layers}: 0-{})",
                layers.saturating_sub(1)
            ));
        }
        Ok(())
    }

    /// Whether two index ranges share a layer.
    pub fn overlaps(self, other: LayerSet) -> bool {
        match (self, other) {
            (
                LayerSet::Range { first, last },
                LayerSet::Range {
                    first: f2,
                    last: l2,
                },
            ) => first <= l2 && f2 <= last,
            _ => false,
        }
    }
}

impl fmt::Display for LayerSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LayerSet::Range { first, last } if first == last => write!(f, "{first}"),
            LayerSet::Range { first, last } => write!(f, "{first}-{last}"),
            LayerSet::Global => write!(f, "global"),
            LayerSet::Local => write!(f, "local"),
            LayerSet::First(n) => write!(f, "first{n}"),
            LayerSet::Last(n) => write!(f, "last{n}"),
        }
    }
}

/// Parses a comma list of layer sets, refusing an empty list and index
/// ranges that share a layer.
pub fn parse_layer_sets(text: &str) -> Result<Vec<LayerSet>, String> {
    let mut sets: Vec<LayerSet> = Vec::new();
    for name in text.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(format!("'{text}' has an empty layer set"));
        }
        let set = LayerSet::parse(name)?;
        if let Some(earlier) = sets.iter().find(|s| s.overlaps(set)) {
            return Err(format!(
                "'{earlier}' and '{set}' name the same layers twice in one part"
            ));
        }
        sets.push(set);
    }
    Ok(sets)
}

/// Maximal runs of equal consecutive items, as `(first, last)` index pairs
/// with the item.
pub fn runs<T: PartialEq + Clone>(items: &[T]) -> Vec<(usize, usize, T)> {
    let mut out: Vec<(usize, usize, T)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match out.last_mut() {
            Some((_, last, run)) if run == item && *last + 1 == i => *last = i,
            _ => out.push((i, i, item.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3 270M: 18 layers, every sixth global.
    fn config() -> Gemma3Config {
        Gemma3Config::published("270m", None).unwrap()
    }

    fn members(text: &str, c: &Gemma3Config) -> Vec<usize> {
        let sets = parse_layer_sets(text).unwrap();
        (0..c.num_hidden_layers)
            .filter(|&i| sets.iter().any(|s| s.contains(i, c)))
            .collect()
    }

    #[test]
    fn named_sets_pick_the_layers_they_say() {
        let c = config();
        assert_eq!(members("global", &c), vec![5, 11, 17]);
        assert_eq!(members("local", &c).len(), 15);
        assert_eq!(members("first2,last2", &c), vec![0, 1, 16, 17]);
        assert_eq!(members("0-1,16-17", &c), vec![0, 1, 16, 17]);
        assert_eq!(members("3, 7-8", &c), vec![3, 7, 8]);
        assert_eq!(members("last8", &c), (10..18).collect::<Vec<_>>());
    }

    #[test]
    fn sets_print_as_they_parse() {
        for text in ["3", "0-1", "global", "local", "first4", "last8"] {
            assert_eq!(LayerSet::parse(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn bad_sets_say_what_is_wrong() {
        let c = config();
        for (text, says) in [
            ("5-3", "backwards"),
            ("first0", "at least 1"),
            ("lastx", "at least 1"),
            ("middle", "global, local, firstN, lastN"),
            ("0-3,2-5", "twice"),
            ("1,,2", "empty"),
        ] {
            let e = parse_layer_sets(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
        for text in ["18", "10-18", "first19", "last19"] {
            let e = LayerSet::parse(text).unwrap().check(&c).unwrap_err();
            assert!(e.contains("0-17"), "{text}: {e}");
        }
        assert!(LayerSet::parse("17").unwrap().check(&c).is_ok());
    }

    #[test]
    fn runs_group_equal_neighbours() {
        assert_eq!(
            runs(&['a', 'a', 'b', 'a']),
            vec![(0, 1, 'a'), (2, 2, 'b'), (3, 3, 'a')]
        );
        assert!(runs::<u8>(&[]).is_empty());
    }
}
