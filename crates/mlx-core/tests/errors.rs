//! Failures come back as `Err` with MLX's own text, never as a panic or an
//! abort; that includes Rust closures called by MLX that fail or panic.

mod common;

use common::{f32s, i32s};
use mlx_core::{quantize, zeros, Array, Dtype, Error, Function};

/// The message of an MLX error (panics on success or on a host-side error).
fn mlx_message<T: std::fmt::Debug>(result: mlx_core::Result<T>) -> String {
    match result {
        Err(Error::Mlx(message)) => message,
        other => panic!("expected an MLX error, got {other:?}"),
    }
}

#[test]
fn adding_unbroadcastable_shapes_is_mlx_broadcast_error() {
    let a = f32s(&[1.0, 2.0, 3.0], &[3]);
    let b = f32s(&[1.0, 2.0], &[2]);
    let message = mlx_message(a.add(&b));
    assert!(message.contains("broadcast"), "{message}");
    assert!(
        message.contains("(3)") && message.contains("(2)"),
        "{message}"
    );
    // The Display form says it comes from MLX.
    assert!(a.add(&b).unwrap_err().to_string().starts_with("MLX: "));
}

#[test]
fn matmul_of_mismatched_inner_dimensions_is_mlx_shape_error() {
    let a = f32s(&[1.0, 2.0, 3.0], &[3, 1]);
    let message = mlx_message(a.matmul(&a));
    assert!(message.contains("matmul"), "{message}");
    assert!(message.contains("shape"), "{message}");
}

#[test]
fn reshape_to_a_different_size_is_mlx_shape_error() {
    let a = f32s(&[1.0, 2.0, 3.0], &[3]);
    let message = mlx_message(a.reshape(&[2, 2]));
    assert!(
        message.contains("reshape") && message.contains("shape"),
        "{message}"
    );
    assert!(a.reshape(&[-1, -1]).is_err(), "two inferred dimensions");
}

#[test]
fn slice_bounds_of_different_lengths_are_errors() {
    let a = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let err = a.slice(&[0, 0], &[1], &[1, 1]).unwrap_err();
    assert!(matches!(err, Error::Host(_)), "{err}");
    assert!(err.to_string().contains("different lengths"), "{err}");
    assert!(a.slice(&[0], &[1], &[1, 1]).is_err());
    let update = f32s(&[9.0], &[1, 1]);
    assert!(a.slice_update(&update, &[0, 0], &[1, 1], &[1]).is_err());
    // Bounds for the wrong number of axes are MLX's to reject.
    assert!(matches!(a.slice(&[0], &[1], &[1]), Err(Error::Mlx(_))));
}

#[test]
fn reading_an_array_as_the_wrong_type_is_an_error() {
    let a = f32s(&[1.0, 2.0], &[2]);
    let err = a.to_vec::<i32>().unwrap_err();
    assert!(
        err.to_string().contains("float32") && err.to_string().contains("int32"),
        "{err}"
    );
    assert!(a.to_vec::<f64>().is_err());
    assert!(a.item::<half::bf16>().is_err());
}

#[test]
fn item_of_several_elements_is_an_error() {
    let err = f32s(&[1.0, 2.0], &[2]).item::<f32>().unwrap_err();
    assert!(err.to_string().contains("one element"), "{err}");
}

#[test]
fn from_slice_with_a_wrong_shape_is_an_error() {
    let err = Array::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2]).unwrap_err();
    assert!(
        err.to_string().contains("4 elements") && err.to_string().contains("3"),
        "{err}"
    );
    assert!(
        Array::from_slice(&[1.0f32], &[-1]).is_err(),
        "negative dimension"
    );
    assert!(
        Array::from_slice(&[1.0f32], &[i32::MAX, i32::MAX, i32::MAX]).is_err(),
        "overflowing size"
    );
}

#[test]
fn from_bytes_rejects_bool_bytes_other_than_zero_and_one() {
    // A bool byte of 2 would be an invalid Rust `bool` when read back.
    let err = Array::from_bytes(&[0, 1, 2], &[3], Dtype::Bool).unwrap_err();
    assert!(err.to_string().contains("bool"), "{err}");
    let ok = Array::from_bytes(&[0, 1, 1], &[3], Dtype::Bool).unwrap();
    assert_eq!(ok.to_vec::<bool>().unwrap(), vec![false, true, true]);
    assert!(Array::from_owned_bytes(vec![1u8, 255], &[2], Dtype::Bool).is_err());
}

#[test]
fn from_bytes_with_an_overflowing_size_is_an_error_not_a_panic() {
    // 2³¹−1 · 2³¹−1 · 4 elements fit in usize, their bytes (· 8) do not.
    let shape = [i32::MAX, i32::MAX, 4];
    assert!(Array::from_bytes(&[0u8; 8], &shape, Dtype::Float64).is_err());
    assert!(Array::from_owned_bytes(vec![0u8; 8], &shape, Dtype::Float64).is_err());
}

#[test]
fn quantize_with_seven_bits_is_an_mlx_error() {
    let w = zeros(&[4, 64], Dtype::Float32).unwrap();
    let message = mlx_message(quantize(&w, 32, 7));
    assert!(message.contains("bits"), "{message}");
    assert!(quantize(&w, 48, 4).is_err(), "group size 48");
    assert!(
        quantize(&zeros(&[4, 30], Dtype::Float32).unwrap(), 32, 4).is_err(),
        "30 columns"
    );
}

#[test]
fn bad_axes_and_indices_are_errors() {
    let a = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    assert!(a.sum(&[2], false).is_err());
    assert!(a.transpose(&[0]).is_err());
    assert!(a.transpose(&[0, 0]).is_err());
    assert!(a.squeeze(&[0]).is_err(), "axis 0 has size 2");
    assert!(a.argmax(5, false).is_err());
    assert!(a.take(&i32s(&[0], &[1]), 3).is_err());
    assert!(a.broadcast_to(&[3, 2]).is_err());
    assert!(a.flatten(1, 0).is_err());
    assert!(mlx_core::concatenate(&[], 0).is_err());
    assert!(mlx_core::stack(&[], 0).is_err());
    assert!(a.topk(3, 1).is_err());
    assert!(zeros(&[-2], Dtype::Float32).is_err());
}

#[test]
fn errors_carry_the_latest_message_of_this_thread() {
    let a = f32s(&[1.0, 2.0, 3.0], &[3]);
    let first = mlx_message(a.reshape(&[2, 2]));
    let second = mlx_message(a.add(&f32s(&[1.0, 2.0], &[2])));
    assert_ne!(first, second);
    // A success in between does not disturb the next failure's message.
    a.add(&a).unwrap();
    assert_eq!(mlx_message(a.reshape(&[2, 2])), first);
}

#[test]
fn errors_on_other_threads_keep_their_own_messages() {
    let handles: Vec<_> = (2..6)
        .map(|n| {
            std::thread::spawn(move || {
                let a = Array::from_slice(&vec![0.0f32; n], &[n as i32]).unwrap();
                let message = mlx_message(a.reshape(&[7, 7]));
                assert!(message.contains(&format!("size {n}")), "{message}");
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_closure_returning_err_propagates_its_message() {
    let f = Function::new(|_: &[Array]| Err(Error::Host("custom failure 42".into()))).unwrap();
    let err = f.call(&[&f32s(&[1.0], &[1])]).unwrap_err();
    assert!(err.to_string().contains("custom failure 42"), "{err}");
    // Through compile too: the failure happens while tracing.
    let compiled = f.compile(false).unwrap();
    let err = compiled.call(&[&f32s(&[1.0], &[1])]).unwrap_err();
    assert!(err.to_string().contains("custom failure 42"), "{err}");
}

#[test]
fn an_mlx_error_inside_a_closure_propagates_mlx_text() {
    let f = Function::new(|args: &[Array]| Ok(vec![args[0].reshape(&[5, 5])?])).unwrap();
    let err = f.call(&[&f32s(&[1.0, 2.0], &[2])]).unwrap_err();
    assert!(err.to_string().contains("reshape"), "{err}");
}

#[test]
fn a_panicking_closure_becomes_an_error_not_an_abort() {
    let f = Function::new(|args: &[Array]| -> mlx_core::Result<Vec<Array>> {
        panic!("closure blew up with {} inputs", args.len())
    })
    .unwrap();
    let err = f.call(&[&f32s(&[1.0], &[1])]).unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
    let err = f
        .compile(true)
        .unwrap()
        .call(&[&f32s(&[1.0], &[1])])
        .unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
    // The function is still usable afterwards (and still fails cleanly).
    assert!(f.call(&[]).is_err());
}

#[test]
fn a_closure_indexing_past_its_inputs_is_an_error() {
    let f = Function::new(|args: &[Array]| Ok(vec![args[3].clone()])).unwrap();
    assert!(f.call(&[&f32s(&[1.0], &[1])]).is_err());
}

#[test]
fn a_compiled_function_called_with_the_wrong_arity_is_an_error() {
    let f = Function::new(|args: &[Array]| Ok(vec![args[0].add(&args[1])?])).unwrap();
    let compiled = f.compile(false).unwrap();
    let x = f32s(&[1.0], &[1]);
    assert_eq!(
        compiled.call(&[&x, &x]).unwrap()[0].item::<f32>().unwrap(),
        2.0
    );
    assert!(compiled.call(&[&x]).is_err());
}
