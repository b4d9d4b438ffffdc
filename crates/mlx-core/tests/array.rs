//! Arrays from host data: every dtype, byte input, zero-copy buffers,
//! scalars, shape queries and reading non-contiguous views.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{f32s, read_f32};
use half::{bf16, f16};
use mlx_core::{Array, Dtype, Element};

/// Round-trips `values` through an MLX array of their dtype.
fn round_trip<T: Element + PartialEq + std::fmt::Debug>(values: &[T], dtype: Dtype) {
    let shape = [values.len() as i32];
    let a = Array::from_slice(values, &shape).unwrap();
    assert_eq!(a.dtype(), dtype);
    assert_eq!(T::DTYPE, dtype);
    assert_eq!(a.shape(), shape);
    assert_eq!(a.nbytes(), values.len() * dtype.size_bytes());
    assert_eq!(a.to_vec::<T>().unwrap(), values);
}

#[test]
fn every_host_dtype_round_trips_exactly_including_extremes() {
    round_trip(&[true, false, true], Dtype::Bool);
    round_trip(&[0u8, 1, 254, u8::MAX], Dtype::Uint8);
    round_trip(&[0u16, 1, 40_000, u16::MAX], Dtype::Uint16);
    round_trip(&[0u32, 7, 3_000_000_000, u32::MAX], Dtype::Uint32);
    round_trip(&[0u64, 1 << 40, u64::MAX - 1, u64::MAX], Dtype::Uint64);
    round_trip(&[i8::MIN, -1, 0, i8::MAX], Dtype::Int8);
    round_trip(&[i16::MIN, -300, 0, i16::MAX], Dtype::Int16);
    round_trip(&[i32::MIN, -70_000, 0, i32::MAX], Dtype::Int32);
    round_trip(&[i64::MIN, -(1 << 50), 0, i64::MAX], Dtype::Int64);
    round_trip(
        &[
            f16::from_f32(-2.5),
            f16::MIN_POSITIVE,
            f16::MAX,
            f16::from_f32(0.0),
        ],
        Dtype::Float16,
    );
    round_trip(
        &[-1.5f32, f32::MIN_POSITIVE, f32::MAX, 1e-30],
        Dtype::Float32,
    );
    round_trip(
        &[std::f64::consts::PI, -1e300, f64::MIN_POSITIVE, 0.1],
        Dtype::Float64,
    );
    round_trip(
        &[
            bf16::from_f32(-3.0),
            bf16::from_f32(1e30),
            bf16::MIN_POSITIVE,
        ],
        Dtype::Bfloat16,
    );
}

#[test]
fn complex64_from_bytes_keeps_real_and_imaginary_parts() {
    // No host type maps to complex64, so it is built from bytes: (1 + 2i), (3 - 4i).
    let parts = [1.0f32, 2.0, 3.0, -4.0];
    let bytes: Vec<u8> = parts.iter().flat_map(|v| v.to_le_bytes()).collect();
    let z = Array::from_bytes(&bytes, &[2], Dtype::Complex64).unwrap();
    assert_eq!(z.dtype(), Dtype::Complex64);
    assert_eq!(z.size(), 2);
    assert_eq!(z.nbytes(), 16);
    // The real part survives a cast to float32.
    assert_eq!(read_f32(&z.astype(Dtype::Float32).unwrap()), vec![1.0, 3.0]);
    // z · z = (1 + 2i)² = -3 + 4i and (3 - 4i)² = -7 - 24i: the real parts
    // -3 and -7 need the imaginary parts to have been read correctly.
    let squared = z.multiply(&z).unwrap().astype(Dtype::Float32).unwrap();
    assert_eq!(read_f32(&squared), vec![-3.0, -7.0]);
}

#[test]
fn complex64_made_by_astype_has_zero_imaginary_part() {
    let z = f32s(&[2.0, -1.0], &[2]).astype(Dtype::Complex64).unwrap();
    assert_eq!(z.dtype(), Dtype::Complex64);
    // (x + 0i)² = x²: a non-zero imaginary part would lower the real part.
    let squared = z.multiply(&z).unwrap().astype(Dtype::Float32).unwrap();
    assert_eq!(read_f32(&squared), vec![4.0, 1.0]);
}

#[test]
fn from_bytes_reads_little_endian_elements() {
    let bytes: Vec<u8> = [1.0f32, -2.0, 0.5, 8.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let a = Array::from_bytes(&bytes, &[2, 2], Dtype::Float32).unwrap();
    assert_eq!(a.shape(), vec![2, 2]);
    assert_eq!(read_f32(&a), vec![1.0, -2.0, 0.5, 8.0]);

    let ints = Array::from_bytes(&[0x01, 0x02, 0xff, 0xff], &[2], Dtype::Int16).unwrap();
    assert_eq!(ints.to_vec::<i16>().unwrap(), vec![0x0201, -1]);
}

#[test]
fn from_fill_writes_the_new_arrays_bytes_or_passes_its_error_on() {
    let a = Array::from_fill(&[3], Dtype::Float32, |bytes| {
        assert_eq!(bytes.len(), 12);
        for (chunk, v) in bytes.chunks_exact_mut(4).zip([1.5f32, -2.0, 4.25]) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        Ok::<(), String>(())
    })
    .unwrap()
    .unwrap();
    assert_eq!(read_f32(&a), vec![1.5, -2.0, 4.25]);
    let failed = Array::from_fill(&[2, 2], Dtype::Uint8, |_| Err("disk gone")).unwrap();
    assert_eq!(failed.err(), Some("disk gone"));
    let empty = Array::from_fill(&[0, 4], Dtype::Float32, |bytes| {
        assert!(bytes.is_empty());
        Ok::<(), ()>(())
    })
    .unwrap()
    .unwrap();
    assert_eq!(empty.shape(), vec![0, 4]);
    // A bool byte of 2 would be an invalid Rust `bool` when read back.
    let bad_bool = Array::from_fill(&[2], Dtype::Bool, |bytes| {
        bytes.copy_from_slice(&[1, 2]);
        Ok::<(), ()>(())
    });
    assert!(bad_bool.is_err());
}

#[test]
fn from_bytes_with_a_wrong_length_is_an_error() {
    let err = Array::from_bytes(&[0u8; 7], &[2], Dtype::Float32).unwrap_err();
    assert!(err.to_string().contains("8 bytes"), "{err}");
}

/// Bytes owned by a test, counting how often it is dropped.
struct CountedBytes {
    bytes: Vec<u8>,
    drops: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for CountedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for CountedBytes {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn counted(values: &[f32]) -> (CountedBytes, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    (
        CountedBytes {
            bytes,
            drops: Arc::clone(&drops),
        },
        drops,
    )
}

#[test]
fn from_owned_bytes_releases_the_owner_exactly_once_by_the_last_drop() {
    let (owner, drops) = counted(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let a = Array::from_owned_bytes(owner, &[2, 3], Dtype::Float32).unwrap();
    let doubled = a.add(&a).unwrap();
    let shared = a.clone();
    drop(a);
    assert!(drops.load(Ordering::SeqCst) <= 1, "owner released twice");
    assert_eq!(read_f32(&doubled), vec![2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
    assert_eq!(read_f32(&shared), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    drop(shared);
    drop(doubled);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn from_owned_bytes_on_the_cpu_build_copies_and_releases_the_owner_at_once() {
    // MLX 0.32.4's CPU allocator cannot adopt foreign memory (its
    // `make_buffer` returns no buffer), so the array constructor copies the
    // bytes into MLX's allocator and calls the release right away. On a GPU
    // build with unified memory the owner would live as long as the array.
    assert_eq!(
        mlx_core::device::default_device().unwrap(),
        mlx_core::Device::Cpu
    );
    let (owner, drops) = counted(&[3.0, 4.0]);
    let a = Array::from_owned_bytes(owner, &[2], Dtype::Float32).unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    assert_eq!(read_f32(&a.square().unwrap()), vec![9.0, 16.0]);
    drop(a);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn from_owned_bytes_with_a_wrong_length_drops_the_owner_and_errs() {
    let (owner, drops) = counted(&[1.0, 2.0, 3.0]);
    let err = Array::from_owned_bytes(owner, &[4], Dtype::Float32).unwrap_err();
    assert!(err.to_string().contains("16 bytes"), "{err}");
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn scalar_is_a_zero_dimensional_array_of_the_asked_dtype() {
    let s = Array::scalar(2.5, Dtype::Float32).unwrap();
    assert_eq!(s.ndim(), 0);
    assert_eq!(s.shape(), Vec::<i32>::new());
    assert_eq!(s.size(), 1);
    assert_eq!(s.nbytes(), 4);
    assert_eq!(s.item::<f32>().unwrap(), 2.5);

    assert_eq!(
        Array::scalar(-7.0, Dtype::Int64)
            .unwrap()
            .item::<i64>()
            .unwrap(),
        -7
    );
    assert!(Array::scalar(1.0, Dtype::Bool)
        .unwrap()
        .item::<bool>()
        .unwrap());
    assert_eq!(
        Array::scalar(1.0 / 3.0, Dtype::Bfloat16)
            .unwrap()
            .item::<bf16>()
            .unwrap()
            .to_bits(),
        0x3EAB
    );
    assert_eq!(
        Array::scalar(0.1, Dtype::Float64)
            .unwrap()
            .item::<f64>()
            .unwrap(),
        0.1,
        "float64 scalars keep full precision"
    );
}

#[test]
fn shape_queries_describe_the_array() {
    let a = Array::from_slice(&[0i16; 24], &[2, 3, 4]).unwrap();
    assert_eq!(a.shape(), vec![2, 3, 4]);
    assert_eq!(a.ndim(), 3);
    assert_eq!(a.size(), 24);
    assert_eq!(a.nbytes(), 48);
    assert_eq!(a.dtype(), Dtype::Int16);
    assert_eq!(a.dim(0).unwrap(), 2);
    assert_eq!(a.dim(2).unwrap(), 4);
    assert_eq!(a.dim(-1).unwrap(), 4);
    assert_eq!(a.dim(-3).unwrap(), 2);
    assert!(a.dim(3).is_err());
    assert!(a.dim(-4).is_err());
    assert_eq!(format!("{a:?}"), "Array { shape: [2, 3, 4], dtype: Int16 }");
}

#[test]
fn dtype_sizes_and_names_match_mlx() {
    let expected = [
        (Dtype::Bool, 1, "bool"),
        (Dtype::Uint8, 1, "uint8"),
        (Dtype::Uint16, 2, "uint16"),
        (Dtype::Uint32, 4, "uint32"),
        (Dtype::Uint64, 8, "uint64"),
        (Dtype::Int8, 1, "int8"),
        (Dtype::Int16, 2, "int16"),
        (Dtype::Int32, 4, "int32"),
        (Dtype::Int64, 8, "int64"),
        (Dtype::Float16, 2, "float16"),
        (Dtype::Float32, 4, "float32"),
        (Dtype::Float64, 8, "float64"),
        (Dtype::Bfloat16, 2, "bfloat16"),
        (Dtype::Complex64, 8, "complex64"),
    ];
    assert_eq!(Dtype::ALL.len(), expected.len());
    for (dtype, size, name) in expected {
        assert_eq!(dtype.size_bytes(), size, "{name}");
        assert_eq!(dtype.name(), name);
        assert_eq!(dtype.to_string(), name);
        // MLX agrees on the element size.
        let a = mlx_core::zeros(&[3], dtype).unwrap();
        assert_eq!(a.dtype(), dtype);
        assert_eq!(a.nbytes(), 3 * size, "{name}");
    }
    let floats: Vec<Dtype> = Dtype::ALL.into_iter().filter(|d| d.is_float()).collect();
    assert_eq!(
        floats,
        vec![
            Dtype::Float16,
            Dtype::Float32,
            Dtype::Float64,
            Dtype::Bfloat16
        ]
    );
}

#[test]
fn item_reads_a_one_element_array_of_any_shape() {
    let a = f32s(&[4.25], &[1, 1]);
    assert_eq!(a.item::<f32>().unwrap(), 4.25);
}

#[test]
fn reading_a_transposed_array_gives_row_major_data_of_the_view() {
    // [[1, 2, 3], [4, 5, 6]]ᵀ = [[1, 4], [2, 5], [3, 6]]
    let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let t = a.t().unwrap();
    assert_eq!(t.shape(), vec![3, 2]);
    assert_eq!(read_f32(&t), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    // Evaluating first (the view then shares the buffer) gives the same.
    t.eval().unwrap();
    assert_eq!(read_f32(&t), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

#[test]
fn reading_strided_and_broadcast_views_gives_their_elements() {
    let a = Array::from_slice(&[0i32, 1, 2, 3, 4, 5, 6, 7, 8, 9], &[10]).unwrap();
    let every_third = a.slice(&[1], &[10], &[3]).unwrap();
    every_third.eval().unwrap();
    assert_eq!(every_third.to_vec::<i32>().unwrap(), vec![1, 4, 7]);
    let tail = a.slice(&[6], &[10], &[1]).unwrap();
    tail.eval().unwrap();
    assert_eq!(tail.to_vec::<i32>().unwrap(), vec![6, 7, 8, 9]);

    let row = Array::from_slice(&[1u8, 2], &[1, 2]).unwrap();
    let tiled = row.broadcast_to(&[3, 2]).unwrap();
    tiled.eval().unwrap();
    assert_eq!(tiled.to_vec::<u8>().unwrap(), vec![1, 2, 1, 2, 1, 2]);
}

#[test]
fn clone_shares_data_and_outlives_the_original() {
    let a = f32s(&[1.0, 2.0], &[2]);
    let b = a.clone();
    drop(a);
    assert_eq!(read_f32(&b), vec![1.0, 2.0]);
}

#[test]
fn empty_arrays_round_trip() {
    let a = Array::from_slice::<f32>(&[], &[0, 3]).unwrap();
    assert_eq!(a.shape(), vec![0, 3]);
    assert_eq!(a.size(), 0);
    assert_eq!(a.nbytes(), 0);
    assert_eq!(read_f32(&a), Vec::<f32>::new());
}

#[test]
fn eval_and_async_eval_compute_several_arrays() {
    let a = f32s(&[1.0, 2.0], &[2]);
    let b = a.multiply(&a).unwrap();
    let c = a.add(&a).unwrap();
    mlx_core::async_eval(&[&b, &c]).unwrap();
    mlx_core::eval(&[&b, &c]).unwrap();
    assert_eq!(read_f32(&b), vec![1.0, 4.0]);
    assert_eq!(read_f32(&c), vec![2.0, 4.0]);
}

#[test]
fn an_array_holds_its_data_once_evaluated() {
    let a = f32s(&[1.0, 2.0], &[2]);
    assert!(a.is_evaluated(), "made from host data");
    let sum = a.add(&a).unwrap();
    assert!(!sum.is_evaluated(), "a lazy sum is only its graph");
    sum.eval().unwrap();
    assert!(sum.is_evaluated());
    assert_eq!(read_f32(&sum), [2.0, 4.0]);
}
