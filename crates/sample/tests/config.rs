//! `SamplerConfig::validate`: defaults, accepted edge values, and an error
//! naming the field and its range for each bad value.

use sample::{SampleError, Sampler, SamplerConfig};

#[test]
fn the_default_is_greedy_and_valid() {
    let config = SamplerConfig::default();
    assert_eq!(config.temperature, 0.0);
    assert_eq!(config.min_tokens_to_keep, 1);
    let windows = (
        config.repetition_window,
        config.presence_window,
        config.frequency_window,
    );
    assert_eq!(windows, (20, 20, 20));
    assert_eq!((config.xtc_probability, config.xtc_threshold), (None, 0.1));
    assert!(config.validate().is_ok());
    assert!(Sampler::new(config).unwrap().is_greedy());
}

#[test]
fn edge_values_are_accepted() {
    let config = SamplerConfig {
        temperature: 2.0,
        top_k: Some(1),
        top_p: Some(1.0),
        min_p: Some(0.0),
        min_tokens_to_keep: 1,
        repetition_penalty: Some(0.5),
        presence_penalty: Some(-2.0),
        frequency_penalty: Some(0.0),
        repetition_window: 1,
        presence_window: 1,
        frequency_window: 1,
        logit_bias: vec![(0, f32::NEG_INFINITY), (3, -100.0), (3, 5.0)],
        xtc_probability: Some(1.0),
        xtc_threshold: 0.5,
        xtc_special_tokens: vec![u32::MAX],
        seed: u64::MAX,
    };
    assert!(config.validate().is_ok());
    assert!(SamplerConfig {
        min_p: Some(1.0),
        top_p: Some(1e-6),
        xtc_probability: Some(0.0),
        xtc_threshold: 0.0,
        ..config
    }
    .validate()
    .is_ok());
}

/// Checks that `config` fails naming `field` and containing `range`.
fn assert_rejected(config: SamplerConfig, field: &str, range: &str) {
    let err = config.validate().unwrap_err();
    let SampleError::InvalidSetting { field: named, .. } = &err else {
        panic!("expected InvalidSetting for {field}, got {err}");
    };
    assert_eq!(*named, field);
    let message = err.to_string();
    assert!(
        message.contains(&format!("`{field}`")) && message.contains(range),
        "{message}"
    );
    assert!(matches!(
        Sampler::new(config),
        Err(SampleError::InvalidSetting { .. })
    ));
}

#[test]
fn each_bad_value_names_its_field_and_range() {
    let base = SamplerConfig::default;
    for t in [-0.1, f32::NAN, f32::INFINITY] {
        assert_rejected(
            SamplerConfig {
                temperature: t,
                ..base()
            },
            "temperature",
            "finite and >= 0",
        );
    }
    assert_rejected(
        SamplerConfig {
            top_k: Some(0),
            ..base()
        },
        "top_k",
        "[1, 2147483647]",
    );
    for p in [0.0, -0.5, 1.01, f32::NAN] {
        assert_rejected(
            SamplerConfig {
                top_p: Some(p),
                ..base()
            },
            "top_p",
            "(0, 1]",
        );
    }
    for p in [-0.01, 1.5, f32::NAN] {
        assert_rejected(
            SamplerConfig {
                min_p: Some(p),
                ..base()
            },
            "min_p",
            "[0, 1]",
        );
    }
    assert_rejected(
        SamplerConfig {
            min_tokens_to_keep: 0,
            ..base()
        },
        "min_tokens_to_keep",
        "[1, 2147483647]",
    );
    for p in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert_rejected(
            SamplerConfig {
                repetition_penalty: Some(p),
                ..base()
            },
            "repetition_penalty",
            "finite and > 0",
        );
    }
    for p in [f32::NAN, f32::NEG_INFINITY] {
        assert_rejected(
            SamplerConfig {
                presence_penalty: Some(p),
                ..base()
            },
            "presence_penalty",
            "finite",
        );
        assert_rejected(
            SamplerConfig {
                frequency_penalty: Some(p),
                ..base()
            },
            "frequency_penalty",
            "finite",
        );
    }
    for (field, config) in [
        (
            "repetition_window",
            SamplerConfig {
                repetition_window: 0,
                ..base()
            },
        ),
        (
            "presence_window",
            SamplerConfig {
                presence_window: 0,
                ..base()
            },
        ),
        (
            "frequency_window",
            SamplerConfig {
                frequency_window: 0,
                ..base()
            },
        ),
    ] {
        assert_rejected(config, field, "[1, 2147483647]");
    }
    for p in [-0.1, 1.5, f32::NAN] {
        assert_rejected(
            SamplerConfig {
                xtc_probability: Some(p),
                ..base()
            },
            "xtc_probability",
            "[0, 1]",
        );
    }
    for t in [-0.1, 0.6, f32::NAN] {
        assert_rejected(
            SamplerConfig {
                xtc_threshold: t,
                ..base()
            },
            "xtc_threshold",
            "[0, 0.5]",
        );
    }
    for b in [f32::NAN, f32::INFINITY] {
        assert_rejected(
            SamplerConfig {
                logit_bias: vec![(1, 0.5), (7, b)],
                ..base()
            },
            "logit_bias",
            "not NaN or +inf",
        );
    }
}

#[test]
fn the_message_shows_the_rejected_value() {
    let err = SamplerConfig {
        top_p: Some(1.5),
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "sampler setting `top_p` = 1.5 is out of range: must be in (0, 1]"
    );
}
