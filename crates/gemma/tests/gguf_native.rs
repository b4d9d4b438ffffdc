//! GGUF weights held as stored (`WeightStorage::Native`) against the same
//! file dequantized at load, on the default model (Q8_0, Q5_0, Q4_K and
//! Q6_K matrices): every projection's product of one row within float
//! summation tolerance, of several rows exactly (they multiply the same
//! dequantized values), and the same greedy tokens; with 8-bit
//! activations, within their KLD budget on every CPU kernel family this CPU
//! runs. The tests read
//! `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf` and skip, saying so,
//! when it is missing.

mod common;

use std::path::{Path, PathBuf};

use common::diff::kl_divergence;
use gemma::cache::CacheFormat;
use gemma::linear::Linear;
use gemma::load::{
    affine_products_on_our_kernel, load, Arithmetic, CpuKernels, LoadOptions, LoadedModel,
    ModelSource, WeightStorage,
};
use gemma::model::Gemma3;
use mlx_core::{random, Array, Dtype};

fn model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/model/gemma-3-270m-q4_k_m.gguf")
}

fn load_as(weights: WeightStorage) -> Option<LoadedModel> {
    let path = model_path();
    if !path.exists() {
        println!("SKIPPED: the default model {} is missing", path.display());
        return None;
    }
    let options = LoadOptions {
        dtype: Dtype::Float32,
        quantize: None,
        weights,
    };
    Some(load(&ModelSource::Gguf(path), options, &mut |_, _| {}).unwrap())
}

/// The default model loaded native and dequantized, or `None` when missing.
fn both() -> Option<(LoadedModel, LoadedModel)> {
    Some((
        load_as(WeightStorage::Native(Arithmetic::f32()))?,
        load_as(WeightStorage::Dequantized)?,
    ))
}

fn floats(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

/// Largest |a − b| over the largest |b|.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / top
}

#[test]
fn native_projections_multiply_as_their_dequantized_weights_do() {
    let Some((native, dense)) = both() else {
        return;
    };
    let (n, d) = (&native.model, &dense.model);
    assert!(
        n.weight_bytes() * 3 < d.weight_bytes(),
        "{} against {}",
        n.weight_bytes(),
        d.weight_bytes()
    );
    let key = random::key(3).unwrap();
    let mut pairs: Vec<(String, &Linear, &Linear)> = vec![("embedding".into(), &n.embed, &d.embed)];
    for (i, (a, b)) in n
        .layers
        .iter()
        .zip(&d.layers)
        .enumerate()
        .filter(|(i, _)| [0, 1, 17].contains(i))
    {
        pairs.push((format!("layer {i} q/k/v"), &a.qkv_proj, &b.qkv_proj));
        pairs.push((format!("layer {i} output"), &a.o_proj, &b.o_proj));
        pairs.push((
            format!("layer {i} gate/up"),
            &a.gate_up_proj,
            &b.gate_up_proj,
        ));
        pairs.push((format!("layer {i} down"), &a.down_proj, &b.down_proj));
    }
    for (name, ours, theirs) in pairs {
        assert!(!matches!(ours, Linear::Dense(_)), "{name} was dequantized");
        let Linear::Dense(w) = theirs else {
            panic!("{name}: the dequantized load is not dense");
        };
        let cols = w.dim(1).unwrap();
        // One row (decoding): our kernel, against MLX's product.
        let x = random::normal(&[1, 1, cols], Dtype::Float32, 0.0, 1.0, Some(&key)).unwrap();
        let gap = relative_gap(
            &floats(&ours.forward(&x).unwrap()),
            &floats(&theirs.forward(&x).unwrap()),
        );
        println!("{name}: one row, relative gap {gap:.2e}");
        assert!(gap < 1e-5, "{name}: {gap}");
        // Several rows (prefill): the same dequantized values, the same product.
        let x = random::normal(&[1, 5, cols], Dtype::Float32, 0.0, 1.0, Some(&key)).unwrap();
        assert_eq!(
            floats(&ours.forward(&x).unwrap()),
            floats(&theirs.forward(&x).unwrap()),
            "{name}: five rows"
        );
    }
    // Embedding rows come out as the dequantized table's.
    let ids = Array::from_slice(&[2i32, 818, 262_143], &[1, 3]).unwrap();
    assert_eq!(
        floats(&n.embed.rows(&ids).unwrap()),
        floats(&d.embed.rows(&ids).unwrap())
    );
}

#[test]
fn native_weights_give_the_greedy_tokens_of_dequantized_ones() {
    let Some((native, dense)) = both() else {
        return;
    };
    let prompt = [2i32, 818, 5279, 529, 7001, 563];
    let run = |loaded: &LoadedModel| -> (Vec<f32>, Vec<i32>) {
        let model = &loaded.model;
        let mut caches = model.make_caches(CacheFormat::COMPUTE).unwrap();
        let logits = model
            .forward(
                &Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap(),
                &mut caches,
            )
            .unwrap();
        let first = floats(&logits);
        let vocab = logits.dim(-1).unwrap() as usize;
        let mut next = argmax(&first[first.len() - vocab..]);
        let mut tokens = vec![next];
        for _ in 0..31 {
            let logits = model
                .forward(&Array::from_slice(&[next], &[1, 1]).unwrap(), &mut caches)
                .unwrap();
            next = argmax(&floats(&logits));
            tokens.push(next);
        }
        (first, tokens)
    };
    let (ours, our_tokens) = run(&native);
    let (theirs, their_tokens) = run(&dense);
    let gap = relative_gap(&ours, &theirs);
    println!("prompt logits: relative gap {gap:.2e}; tokens {our_tokens:?}");
    assert!(gap < 1e-4, "{gap}");
    assert_eq!(our_tokens, their_tokens);
}

fn argmax(row: &[f32]) -> i32 {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::MIN),
            |best, (i, &v)| if v > best.1 { (i, v) } else { best },
        )
        .0 as i32
}

#[test]
fn native_weights_refuse_another_compute_dtype_by_name() {
    let path = model_path();
    if !path.exists() {
        println!("SKIPPED: the default model {} is missing", path.display());
        return;
    }
    let options = LoadOptions {
        dtype: Dtype::Bfloat16,
        quantize: None,
        weights: WeightStorage::Native(Arithmetic::int8(CpuKernels::best().unwrap())),
    };
    let Err(error) = load(&ModelSource::Gguf(path), options, &mut |_, _| {}) else {
        panic!("a bfloat16 load of native weights succeeded");
    };
    let message = error.to_string();
    assert!(
        message.contains("gemma-3-270m-q4_k_m.gguf") && message.contains("float32 only"),
        "{message}"
    );
}

/// KL divergences of `int8`'s next-token distributions from `float`'s over
/// 40 tokens: a short prompt read at once (products of several rows), then
/// the float model's greedy continuation one token at a time. Returns the
/// prompt's and the following tokens' values.
fn activation_klds(float: &Gemma3, int8: &Gemma3) -> (Vec<f64>, Vec<f64>) {
    let prompt = [2i32, 818, 5279, 529, 7001, 563, 496, 1607, 236764];
    let mut caches = (
        float.make_caches(CacheFormat::COMPUTE).unwrap(),
        int8.make_caches(CacheFormat::COMPUTE).unwrap(),
    );
    let input = Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap();
    let p = floats(&float.forward(&input, &mut caches.0).unwrap());
    let q = floats(&int8.forward(&input, &mut caches.1).unwrap());
    let vocab = p.len() / prompt.len();
    let read_at_once = p
        .chunks_exact(vocab)
        .zip(q.chunks_exact(vocab))
        .map(|(p, q)| kl_divergence(p, q))
        .collect();
    let mut one_by_one = Vec::new();
    let mut token = argmax(&p[p.len() - vocab..]);
    for _ in prompt.len()..40 {
        let input = Array::from_slice(&[token], &[1, 1]).unwrap();
        let p = floats(&float.forward(&input, &mut caches.0).unwrap());
        let q = floats(&int8.forward(&input, &mut caches.1).unwrap());
        one_by_one.push(kl_divergence(&p, &q));
        token = argmax(&p);
    }
    (read_at_once, one_by_one)
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

#[test]
fn eight_bit_activations_stay_within_the_kld_budget_of_float_ones() {
    let Some(float) = load_as(WeightStorage::Native(Arithmetic::f32())) else {
        return;
    };
    for family in CpuKernels::supported().unwrap() {
        let Some(int8) = load_as(WeightStorage::Native(Arithmetic::int8(family))) else {
            return;
        };
        let (prompt, rest) = activation_klds(&float.model, &int8.model);
        let all = [prompt.clone(), rest].concat();
        let (mean_all, prompt_mean) = (mean(&all), mean(&prompt));
        let largest = all.iter().fold(0f64, |m, &v| m.max(v));
        println!(
            "{family}: int8 against f32 activations over 40 tokens: mean KLD {mean_all:.2e} \
             (the {} read at once: {prompt_mean:.2e}), largest {largest:.2e}",
            prompt.len()
        );
        assert!(
            prompt_mean > 0.0,
            "{family}: the prompt's logits were identical: its products did not take 8-bit \
             activations"
        );
        assert!(
            mean_all > 0.0,
            "{family}: the two paths gave identical logits: 8-bit activations were not used"
        );
        assert!(mean_all < 0.005, "{family}: mean KLD {mean_all}");
    }
}

#[test]
fn eight_bit_activations_on_affine_weights_stay_within_the_kld_budget() {
    // The default model quantized to MLX's 4-bit affine format at load:
    // MLX's `quantized_matmul` with float32 activations against our kernel
    // with 8-bit ones (single rows; several rows take the dequantized
    // matrix on both).
    let path = model_path();
    if !path.exists() {
        println!("SKIPPED: the default model {} is missing", path.display());
        return;
    }
    let options = LoadOptions {
        dtype: Dtype::Float32,
        quantize: Some((4, 64)),
        weights: WeightStorage::Dequantized,
    };
    let float = load(&ModelSource::Gguf(path), options, &mut |_, _| {}).unwrap();
    for family in CpuKernels::supported().unwrap() {
        let mut int8 = float.model.clone();
        affine_products_on_our_kernel(&mut int8, family).unwrap();
        let on_our_kernel = |l: &Linear| matches!(l, Linear::QuantizedCpu(_, f) if *f == family);
        let moved = usize::from(on_our_kernel(&int8.embed))
            + int8
                .layers
                .iter()
                .flat_map(|l| l.projections())
                .filter(|l| on_our_kernel(l))
                .count();
        if family == CpuKernels::Portable {
            // No affine kernel of ours there: MLX's own product stays.
            assert_eq!(moved, 0, "the portable family has no affine kernel");
            continue;
        }
        assert_eq!(
            moved,
            1 + 4 * 18,
            "{family}: every projection and the embedding"
        );
        let (_, one_by_one) = activation_klds(&float.model, &int8);
        let (m, largest) = (
            mean(&one_by_one),
            one_by_one.iter().fold(0f64, |m, &v| m.max(v)),
        );
        println!(
            "{family}: 4-bit affine, int8 against f32 activations over {} tokens decoded one by \
             one: mean KLD {m:.2e}, largest {largest:.2e}",
            one_by_one.len()
        );
        assert!(
            m > 0.0,
            "{family}: identical logits: 8-bit activations were not used"
        );
        assert!(m < 0.005, "{family}: mean KLD {m}");
    }
}

/// The prompts of mlx-lm's greedy fixture (`engine/tests/fixtures`), as
/// token ids: English, code, German, a story.
const FIXTURE_PROMPTS: [&[i32]; 4] = [
    &[2, 818, 5279, 529, 7001, 563],
    &[2, 2063, 10779, 78113, 236769, 236749, 1473],
    &[
        2, 17361, 198725, 8518, 2253, 117419, 6247, 236745, 8046, 2034, 2854, 64435, 81368, 236764,
        941, 14180,
    ],
    &[2, 14946, 3324, 496, 990],
];

/// Logits of each position of `ids` fed one token at a time after the
/// prompt `prompt` read at once (the decode path), one row per fed token.
fn decoded_logits(model: &Gemma3, prompt: &[i32], ids: &[i32]) -> Vec<Vec<f32>> {
    let mut caches = model.make_caches(CacheFormat::COMPUTE).unwrap();
    let input = Array::from_slice(prompt, &[1, prompt.len() as i32]).unwrap();
    let first = floats(&model.forward(&input, &mut caches).unwrap());
    let vocab = first.len() / prompt.len();
    let mut rows = vec![first[first.len() - vocab..].to_vec()];
    for &id in ids {
        let input = Array::from_slice(&[id], &[1, 1]).unwrap();
        rows.push(floats(&model.forward(&input, &mut caches).unwrap()));
    }
    rows
}

#[test]
fn cpu_kernel_families_part_only_by_their_float_rounding() {
    // Each family's integer sums are exact; they add the scaled partial
    // sums in different orders, and a rounding flipped there can move an
    // 8-bit activation of a later product by one step. Fed the same tokens
    // (the first family's greedy continuation, 32 of each fixture prompt,
    // so that up to the first other argmax a pair of families would have
    // generated the same tokens), every pair of families' distributions
    // stay within the 8-bit path's KLD budget of each other; the figures
    // are those of docs/architecture.md ("CPU kernel families").
    let models: Vec<(CpuKernels, LoadedModel)> = CpuKernels::supported()
        .unwrap()
        .into_iter()
        .filter_map(|f| Some((f, load_as(WeightStorage::Native(Arithmetic::int8(f)))?)))
        .collect();
    let Some((_, first)) = models.first() else {
        return;
    };
    for (p, prompt) in FIXTURE_PROMPTS.iter().enumerate() {
        let model = &first.model;
        let mut caches = model.make_caches(CacheFormat::COMPUTE).unwrap();
        let input = Array::from_slice(prompt, &[1, prompt.len() as i32]).unwrap();
        let logits = floats(&model.forward(&input, &mut caches).unwrap());
        let vocab = logits.len() / prompt.len();
        let mut tokens = vec![argmax(&logits[logits.len() - vocab..])];
        while tokens.len() < 32 {
            let input = Array::from_slice(&tokens[tokens.len() - 1..], &[1, 1]).unwrap();
            tokens.push(argmax(&floats(
                &model.forward(&input, &mut caches).unwrap(),
            )));
        }
        let fed = &tokens[..31];
        let rows: Vec<Vec<Vec<f32>>> = models
            .iter()
            .map(|(_, m)| decoded_logits(&m.model, prompt, fed))
            .collect();
        for a in 0..models.len() {
            for b in a + 1..models.len() {
                let mut largest = 0f32;
                let mut klds = Vec::new();
                let mut first_other = None;
                for (i, (x, y)) in rows[b].iter().zip(&rows[a]).enumerate() {
                    largest = x
                        .iter()
                        .zip(y)
                        .fold(largest, |m, (u, v)| m.max((u - v).abs()));
                    klds.push(kl_divergence(y, x));
                    if first_other.is_none() && argmax(x) != argmax(y) {
                        first_other = Some(i);
                    }
                }
                let (m, top) = (mean(&klds), klds.iter().fold(0f64, |m, &v| m.max(v)));
                let (fa, fb) = (models[a].0, models[b].0);
                println!(
                    "prompt {p}, {fb} against {fa} over 32 tokens: max |Δ logit| {largest:.3}, \
                     mean KLD {m:.2e} (largest {top:.2e}), first other greedy token: \
                     {first_other:?}"
                );
                assert!(m < 0.005, "prompt {p}, {fb} against {fa}: mean KLD {m}");
            }
        }
    }
}
