//! Reading well-formed GGUF files written by the test writer.

mod gguf_support;

use gemma::gguf::GgufValue;
use gemma::quant::GgufDtype;
use gguf_support::{open_bytes, Builder};

fn every_value_type() -> Vec<(&'static str, GgufValue)> {
    vec![
        ("u8", GgufValue::U8(200)),
        ("i8", GgufValue::I8(-100)),
        ("u16", GgufValue::U16(60_000)),
        ("i16", GgufValue::I16(-30_000)),
        ("u32", GgufValue::U32(4_000_000_000)),
        ("i32", GgufValue::I32(-2_000_000_000)),
        ("f32", GgufValue::F32(1e-6)),
        ("bool", GgufValue::Bool(true)),
        ("string", GgufValue::String("héllo ▁world".into())),
        ("u64", GgufValue::U64(u64::MAX)),
        ("i64", GgufValue::I64(i64::MIN)),
        ("f64", GgufValue::F64(-2.5e300)),
        ("empty", GgufValue::Array(vec![])),
        (
            "nested",
            GgufValue::Array(vec![
                GgufValue::Array(vec![GgufValue::I32(1), GgufValue::I32(-2)]),
                GgufValue::Array(vec![GgufValue::I32(3)]),
            ]),
        ),
        (
            "strings",
            GgufValue::Array(vec![
                GgufValue::String("a".into()),
                GgufValue::String(String::new()),
            ]),
        ),
    ]
}

#[test]
fn all_value_types_round_trip_in_v2_and_v3() {
    for version in [2, 3] {
        let mut b = Builder {
            version,
            ..Builder::default()
        };
        for (key, value) in every_value_type() {
            b = b.meta(key, value);
        }
        let (_dir, opened) = open_bytes("values.gguf", &b.build());
        let file = opened.expect("open");
        assert_eq!(file.version(), version);
        assert_eq!(file.metadata().len(), every_value_type().len());
        for (key, value) in every_value_type() {
            assert_eq!(file.get(key), Some(&value), "{key}");
        }
        assert!(file.tensors().is_empty());
    }
}

#[test]
fn value_accessors_convert_only_what_fits() {
    assert_eq!(GgufValue::U32(7).as_u64(), Some(7));
    assert_eq!(GgufValue::I32(-1).as_u64(), None);
    assert_eq!(GgufValue::I32(-1).as_i64(), Some(-1));
    assert_eq!(GgufValue::U64(u64::MAX).as_i64(), None);
    assert_eq!(GgufValue::F32(0.5).as_f64(), Some(0.5));
    assert_eq!(GgufValue::U32(1).as_f64(), None);
    assert_eq!(GgufValue::String("x".into()).as_str(), Some("x"));
    assert_eq!(GgufValue::Bool(true).as_str(), None);
    assert_eq!(
        GgufValue::Array(vec![GgufValue::U8(1)])
            .as_array()
            .map(<[_]>::len),
        Some(1)
    );
}

#[test]
fn tensors_keep_file_order_shape_offset_and_bytes() {
    let q8: Vec<u8> = (0..68).map(|i| i as u8).collect();
    let f32s: Vec<u8> = [1.0f32, -2.0, 3.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bytes = Builder::default()
        .meta("general.architecture", GgufValue::String("test".into()))
        .tensor("z.weight", &[32, 2], GgufDtype::Q8_0.id(), q8.clone())
        .tensor("a.weight", &[3], GgufDtype::F32.id(), f32s.clone())
        .build();
    let (_dir, opened) = open_bytes("tensors.gguf", &bytes);
    let file = opened.expect("open");
    let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["z.weight", "a.weight"]);

    let z = file.tensor("z.weight").expect("z");
    assert_eq!(z.shape, vec![32, 2]);
    assert_eq!(z.row_major_shape(), vec![2, 32]);
    assert_eq!(
        (z.dtype, z.n_bytes, z.n_elements()),
        (GgufDtype::Q8_0, 68, 64)
    );
    assert_eq!(z.offset, file.data_offset());
    assert_eq!(file.tensor_bytes(z), &q8[..]);

    let a = file.tensor("a.weight").expect("a");
    assert_eq!(
        a.offset,
        file.data_offset() + 96,
        "68 bytes rounded up to the 32-byte alignment"
    );
    assert_eq!(file.tensor_bytes(a), &f32s[..]);
    assert_eq!(
        file.dequantize_f32("a.weight").expect("a"),
        vec![1.0, -2.0, 3.5]
    );
    assert_eq!(file.data_offset() % 32, 0);
    assert!(file.tensor("missing").is_none());
}
