//! Functions of arrays and their compiled versions.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use common::{assert_close, f32s, read_f32};
use mlx_core::{arange, Array, Dtype, Function, Result};

fn scalar(v: f64) -> Array {
    Array::scalar(v, Dtype::Float32).unwrap()
}

/// gelu with the tanh approximation, written as a chain of elementwise ops:
/// 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))).
fn gelu_tanh(x: &Array) -> Result<Array> {
    let cube = x.multiply(x)?.multiply(x)?;
    let inner = x.add(&cube.multiply(&scalar(0.044715))?)?;
    let t = inner
        .multiply(&scalar((2.0 / std::f64::consts::PI).sqrt()))?
        .tanh()?;
    x.multiply(&scalar(0.5))?.multiply(&t.add(&scalar(1.0))?)
}

fn gelu_by_hand(x: f64) -> f32 {
    (0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh()))
        as f32
}

/// 1000 points evenly spaced over [−5, 5).
fn points() -> Array {
    arange(-5.0, 5.0, 0.01, Dtype::Float32).unwrap()
}

fn gelu_function() -> Function {
    Function::new(|args: &[Array]| Ok(vec![gelu_tanh(&args[0])?])).unwrap()
}

#[test]
fn a_plain_function_computes_its_closure() {
    let f = gelu_function();
    let x = points();
    let out = f.call(&[&x]).unwrap();
    assert_eq!(out.len(), 1);
    let expected: Vec<f32> = read_f32(&x)
        .iter()
        .map(|&v| gelu_by_hand(f64::from(v)))
        .collect();
    assert_close(&read_f32(&out[0]), &expected, 1e-5);
}

#[test]
fn a_compiled_gelu_chain_equals_the_plain_one() {
    let f = gelu_function();
    let compiled = f.compile(false).unwrap();
    let x = points();
    assert_eq!(x.size(), 1000);
    let plain = read_f32(&f.call(&[&x]).unwrap()[0]);
    let fused = read_f32(&compiled.call(&[&x]).unwrap()[0]);
    assert_close(&fused, &plain, 1e-6);
    // Called again (from the compile cache) it gives the same.
    let again = read_f32(&compiled.call(&[&x]).unwrap()[0]);
    assert_eq!(again, fused);
}

#[test]
fn functions_take_and_return_several_arrays() {
    let f = Function::new(|args: &[Array]| {
        Ok(vec![args[0].add(&args[1])?, args[0].multiply(&args[1])?])
    })
    .unwrap();
    let compiled = f.compile(false).unwrap();
    let (a, b) = (f32s(&[1.0, 2.0], &[2]), f32s(&[3.0, 4.0], &[2]));
    for g in [&f, &compiled] {
        let out = g.call(&[&a, &b]).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(read_f32(&out[0]), vec![4.0, 6.0]);
        assert_eq!(read_f32(&out[1]), vec![3.0, 8.0]);
    }
}

/// x² + x, counting how often its closure runs (traces, for compiled ones).
fn counting_square(runs: &Arc<AtomicUsize>) -> Function {
    let runs = Arc::clone(runs);
    Function::new(move |args: &[Array]| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(vec![args[0].square()?.add(&args[0])?])
    })
    .unwrap()
}

/// An evaluated float32 vector (MLX retraces a shaped function once more
/// when its first input was not yet evaluated, as Python MLX does too).
fn evaluated(values: &[f32]) -> Array {
    let a = f32s(values, &[values.len() as i32]);
    a.eval().unwrap();
    a
}

/// Calls a throwaway compiled function once: the first compiled function a
/// thread calls is traced twice on its first shape (MLX 0.32.4 does this in
/// Python too), which would blur the trace counts below.
fn warm_up_compile_on_this_thread() {
    let warm = Function::new(|args: &[Array]| Ok(vec![args[0].negative()?])).unwrap();
    let compiled = warm.compile(false).unwrap();
    compiled.call(&[&evaluated(&[1.0])]).unwrap()[0]
        .eval()
        .unwrap();
}

#[test]
fn shapeless_compile_handles_two_shapes_with_one_trace() {
    warm_up_compile_on_this_thread();
    let runs = Arc::new(AtomicUsize::new(0));
    let compiled = counting_square(&runs).compile(true).unwrap();
    let three = compiled.call(&[&f32s(&[1.0, 2.0, 3.0], &[3])]).unwrap();
    assert_eq!(read_f32(&three[0]), vec![2.0, 6.0, 12.0]);
    let five = compiled
        .call(&[&f32s(&[0.5, -1.0, 4.0, 0.0, 2.0], &[5])])
        .unwrap();
    assert_eq!(five[0].shape(), vec![5]);
    assert_eq!(read_f32(&five[0]), vec![0.75, 0.0, 20.0, 0.0, 6.0]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "traced more than once");
}

#[test]
fn shaped_compile_traces_once_per_shape() {
    warm_up_compile_on_this_thread();
    let runs = Arc::new(AtomicUsize::new(0));
    let compiled = counting_square(&runs).compile(false).unwrap();
    let three = evaluated(&[1.0, 2.0, 3.0]);
    assert_eq!(
        read_f32(&compiled.call(&[&three]).unwrap()[0]),
        vec![2.0, 6.0, 12.0]
    );
    assert_eq!(
        read_f32(&compiled.call(&[&three]).unwrap()[0]),
        vec![2.0, 6.0, 12.0]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let two = evaluated(&[3.0, -2.0]);
    assert_eq!(
        read_f32(&compiled.call(&[&two]).unwrap()[0]),
        vec![12.0, 2.0]
    );
    assert_eq!(
        read_f32(&compiled.call(&[&two]).unwrap()[0]),
        vec![12.0, 2.0]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[test]
fn a_closure_can_capture_arrays() {
    let weight = f32s(&[2.0, -1.0], &[2]);
    let f = Function::new(move |args: &[Array]| Ok(vec![args[0].multiply(&weight)?])).unwrap();
    let compiled = f.compile(false).unwrap();
    let x = f32s(&[3.0, 4.0], &[2]);
    assert_eq!(read_f32(&compiled.call(&[&x]).unwrap()[0]), vec![6.0, -4.0]);
}

/// Counts its drops.
struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn function_owning(counter: DropCounter) -> Function {
    Function::new(move |args: &[Array]| {
        let _held = &counter;
        Ok(vec![args[0].negative()?])
    })
    .unwrap()
}

#[test]
fn dropping_a_function_frees_its_closure_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let f = function_owning(DropCounter(Arc::clone(&drops)));
    assert_eq!(
        read_f32(&f.call(&[&f32s(&[1.0], &[1])]).unwrap()[0]),
        vec![-1.0]
    );
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(f);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn a_compiled_function_keeps_the_closure_until_it_is_dropped_too() {
    let drops = Arc::new(AtomicUsize::new(0));
    let f = function_owning(DropCounter(Arc::clone(&drops)));
    let compiled = f.compile(false).unwrap();
    drop(f);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "closure freed while the compiled function lives"
    );
    assert_eq!(
        read_f32(&compiled.call(&[&f32s(&[2.0], &[1])]).unwrap()[0]),
        vec![-2.0]
    );
    drop(compiled);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn dropping_the_compiled_function_first_also_frees_the_closure_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let f = function_owning(DropCounter(Arc::clone(&drops)));
    let compiled = f.compile(true).unwrap();
    assert_eq!(
        read_f32(&compiled.call(&[&f32s(&[2.0], &[1])]).unwrap()[0]),
        vec![-2.0]
    );
    drop(compiled);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(f);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn a_new_compiled_function_never_reuses_an_old_trace() {
    // Compiled functions are keyed in MLX's compile cache; a dropped one must
    // not leave a trace behind that a later function picks up.
    let x = f32s(&[1.0, 2.0], &[2]);
    for k in 0..20 {
        let c = scalar(f64::from(k));
        let f = Function::new(move |args: &[Array]| Ok(vec![args[0].add(&c)?])).unwrap();
        let compiled = f.compile(false).unwrap();
        drop(f);
        let k = k as f32;
        assert_eq!(
            read_f32(&compiled.call(&[&x]).unwrap()[0]),
            vec![1.0 + k, 2.0 + k]
        );
    }
}

#[test]
fn a_compiled_function_dropped_on_another_thread_leaves_no_trace_for_later_ones() {
    // MLX keeps one compile cache per thread. A function traced on a worker
    // and dropped here leaves its trace in the worker's cache; a later
    // function must never be served that trace (this failed when compiled
    // functions were keyed by their reused heap address).
    type Job = (Function, mpsc::Sender<(Function, Vec<f32>)>);
    let (to_worker, jobs) = mpsc::channel::<Job>();
    let worker = std::thread::spawn(move || {
        for (f, reply) in jobs {
            let x = f32s(&[1.0, 2.0], &[2]);
            let out = read_f32(&f.call(&[&x]).unwrap()[0]);
            reply.send((f, out)).unwrap();
        }
    });
    for k in 0..20 {
        let c = scalar(f64::from(k) * 100.0);
        let f = Function::new(move |args: &[Array]| Ok(vec![args[0].add(&c)?])).unwrap();
        let compiled = f.compile(false).unwrap();
        drop(f);
        let (reply, answer) = mpsc::channel();
        to_worker.send((compiled, reply)).unwrap();
        let (compiled, out) = answer.recv().unwrap();
        let k = k as f32 * 100.0;
        assert_eq!(out, vec![1.0 + k, 2.0 + k]);
        drop(compiled);
    }
    drop(to_worker);
    worker.join().unwrap();
}
