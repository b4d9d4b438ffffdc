//! MLX's memory counters: no leak over many evaluated arrays, limits and
//! cache control.
//!
//! The counters are global to the process and tests of one binary run in
//! parallel threads, so this binary holds a single test that runs its steps
//! in order, with nothing else allocating meanwhile.

use std::sync::mpsc;

use mlx_core::{memory, zeros, Array, Dtype, Function};

const MIB: usize = 1 << 20;

/// Creates, evaluates and drops `count` arrays of 1 MiB (262144 float32).
fn churn(count: usize) {
    let one = Array::scalar(1.0, Dtype::Float32).unwrap();
    for i in 0..count {
        let a = zeros(&[262_144], Dtype::Float32)
            .unwrap()
            .add(&one)
            .unwrap();
        a.eval().unwrap();
        if i == 0 {
            // The sum really was computed (and so allocated).
            assert_eq!(a.nbytes(), MIB);
            assert_eq!(a.max_all().unwrap().item::<f32>().unwrap(), 1.0);
        }
    }
}

fn leak_test_of_100_000_arrays_of_one_mib() {
    // Warm up MLX (scheduler, caches) so the baseline is stable.
    churn(10);
    let start = memory::active_bytes().unwrap();
    memory::reset_peak().unwrap();
    assert!(memory::peak_bytes().unwrap() <= start + MIB);
    churn(100_000);
    let peak = memory::peak_bytes().unwrap();
    let end = memory::active_bytes().unwrap();
    assert!(
        peak >= start + MIB,
        "peak {peak} did not rise 1 MiB above {start}: nothing was allocated"
    );
    assert_eq!(end, start, "active memory grew from {start} to {end} bytes");
    // And no run-away cache: at most a few buffers are kept for reuse.
    assert!(memory::cache_bytes().unwrap() <= 16 * MIB);
}

fn limits_return_their_previous_values() {
    let original_cache = memory::set_cache_limit(123 * MIB).unwrap();
    assert_eq!(memory::set_cache_limit(original_cache).unwrap(), 123 * MIB);

    let original_limit = memory::memory_limit().unwrap();
    assert!(original_limit > 0);
    assert_eq!(
        memory::set_memory_limit(4096 * MIB).unwrap(),
        original_limit
    );
    assert_eq!(memory::memory_limit().unwrap(), 4096 * MIB);
    assert_eq!(
        memory::set_memory_limit(original_limit).unwrap(),
        4096 * MIB
    );
    assert_eq!(memory::memory_limit().unwrap(), original_limit);
}

fn clear_cache_empties_the_cache() {
    // A freed buffer goes to the cache first.
    churn(3);
    assert!(
        memory::cache_bytes().unwrap() >= MIB,
        "no freed buffer was cached"
    );
    memory::clear_cache().unwrap();
    assert_eq!(memory::cache_bytes().unwrap(), 0);
}

fn a_cache_limit_of_zero_keeps_nothing_cached() {
    let previous = memory::set_cache_limit(0).unwrap();
    churn(3);
    assert_eq!(memory::cache_bytes().unwrap(), 0);
    memory::set_cache_limit(previous).unwrap();
}

fn a_raised_cache_limit_keeps_buffers_until_dropped() {
    let previous = memory::set_cache_limit(0).unwrap();
    {
        let _raised = memory::CacheLimitRaised::at_least(8 * MIB).unwrap();
        churn(3);
        assert!(
            memory::cache_bytes().unwrap() >= MIB,
            "the raised limit kept no freed buffer"
        );
        // A limit already higher is left as it is.
        let _inner = memory::CacheLimitRaised::at_least(MIB).unwrap();
        assert_eq!(memory::set_cache_limit(8 * MIB).unwrap(), 8 * MIB);
    }
    // Dropped: the limit of 0 is back, and the cache empty.
    assert_eq!(memory::cache_bytes().unwrap(), 0);
    assert_eq!(memory::set_cache_limit(previous).unwrap(), 0);
}

/// Work for a thread that keeps running between jobs (and so keeps its
/// compile cache).
type Job = Box<dyn FnOnce() + Send>;

fn run_on(worker: &mpsc::Sender<Job>, job: impl FnOnce() + Send + 'static) {
    let (done, wait) = mpsc::channel();
    worker
        .send(Box::new(move || {
            job();
            done.send(()).unwrap();
        }))
        .unwrap();
    wait.recv().unwrap();
}

/// A compiled function of one input that captures an 8 MiB weight.
fn compiled_with_weight() -> Function {
    let weight = Array::from_slice(&vec![0.5f32; 2 * 1024 * 1024], &[2 * 1024 * 1024]).unwrap();
    let f = Function::new(move |args: &[Array]| Ok(vec![weight.multiply(&args[0])?.sum_all()?]))
        .unwrap();
    f.compile(false).unwrap()
}

fn a_trace_dropped_on_another_thread_is_freed_by_that_thread() {
    let (worker, jobs) = mpsc::channel::<Job>();
    let thread = std::thread::spawn(move || jobs.into_iter().for_each(|job| job()));
    let two = || Array::from_slice(&[2.0f32], &[1]).unwrap();
    // Warm up the worker's compile cache.
    run_on(&worker, move || {
        let warm = Function::new(|args: &[Array]| Ok(vec![args[0].negative()?]))
            .unwrap()
            .compile(false)
            .unwrap();
        warm.call(&[&two()]).unwrap()[0].eval().unwrap();
    });
    memory::clear_cache().unwrap();
    let start = memory::active_bytes().unwrap();

    // Traced on the worker, dropped here: the worker's cache still holds the
    // trace, and with it the weight.
    let compiled = compiled_with_weight();
    let (back, returned) = mpsc::channel();
    run_on(&worker, move || {
        let sum = compiled.call(&[&two()]).unwrap()[0].item::<f32>().unwrap();
        assert_eq!(sum, 2.0 * 1024.0 * 1024.0);
        back.send(compiled).unwrap();
    });
    drop(returned.recv().unwrap());
    assert!(
        memory::active_bytes().unwrap() >= start + 8 * MIB,
        "the trace does not hold the weight: this check proves nothing"
    );

    // The worker's next compiled call erases the dropped function's trace.
    run_on(&worker, move || {
        let other = Function::new(|args: &[Array]| Ok(vec![args[0].square()?]))
            .unwrap()
            .compile(false)
            .unwrap();
        assert_eq!(
            other.call(&[&two()]).unwrap()[0].item::<f32>().unwrap(),
            4.0
        );
    });
    assert_eq!(
        memory::active_bytes().unwrap(),
        start,
        "the trace's weight was not freed"
    );
    drop(worker);
    thread.join().unwrap();
}

#[test]
fn memory_counters_in_sequence() {
    leak_test_of_100_000_arrays_of_one_mib();
    a_trace_dropped_on_another_thread_is_freed_by_that_thread();
    limits_return_their_previous_values();
    clear_cache_empties_the_cache();
    a_cache_limit_of_zero_keeps_nothing_cached();
    a_raised_cache_limit_keeps_buffers_until_dropped();
}
